"""The pure fold: one input and a thread's state in, the new state and effects out.

`transitions` holds the entry point (`fold`) and the transition table; the handlers are
in `inbound` (events, reports, summaries), `pending` (calls and completions waiting),
`calls` (the model's tool calls), `draft` (the mutable draft a handler writes), with
`state` (the thread state and facts), `effects` (what the shell must do), `builtins`,
`children`, `forks` (a new thread from another's history), `receipts` and `history` (the
hash chain). `verify` and `authority` judge an input's provenance before it is folded.
Nothing here reads a clock or does I/O.
"""
