"""The inspector behind `torpor ui`: a web page of what the agents are doing.

`index` (the threads list, a pure fold of events and receipts), `feed` (the reader that
keeps it current), `timeline` (one thread's snapshot-then-follow stream), `desk` (the
operator's signed approvals and controls), `bridge` (a blocking read served to the event
loop), `plain` (records as JSON) and `app` (the Starlette app and its routes). The
page itself is plain HTML and JavaScript in `static/`. It depends on `schemas` and
`streams` only; the command line composes it (`torpor.cli.ui`).
"""
