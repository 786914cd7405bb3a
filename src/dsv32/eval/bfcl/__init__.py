"""BFCL v4 (the Berkeley Function Calling Leaderboard) from the ``bfcl-eval`` package's data:
single-turn categories graded by BFCL's own AST checker (:mod:`.single`, :mod:`.official`) and
multi-turn categories executed against the package's API classes in a sandboxed worker
(:mod:`.multi_turn`, :mod:`.api`, :mod:`.worker`)."""
