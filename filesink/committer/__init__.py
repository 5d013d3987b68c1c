"""The commit ledger (:mod:`.ledger`: pre-commit, commit with truncate, drop, writer terms; the file states), and
the checks of damaged log segments before a roll's pre-commit and after a failed write (:mod:`.damage`)."""
