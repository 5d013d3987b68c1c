"""Start-up and operator recovery of a sink: fencing, visibility-checked truncate or rewind, rescale."""
