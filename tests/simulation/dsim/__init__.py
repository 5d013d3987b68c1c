"""A deterministic simulation of the sink's ownership protocol, in the manner of FoundationDB's simulation tests.

The real :class:`logstore.LogStore`, :class:`filesink.committer.ledger.Ledger`, sink steps and recovery run in threads
over an in-memory log store (:mod:`.storage`) and a modelled output (:mod:`.output`). Only one thread runs at a time:
every storage call hands the baton to a seeded scheduler (:mod:`.scheduler`), which picks who runs next, and
may crash or pause the caller there. An interleaving is a pure function of its seed, so a failure replays
exactly (:mod:`.run` runs one seed; :mod:`.checker` decides whether its output is exactly once).
"""
