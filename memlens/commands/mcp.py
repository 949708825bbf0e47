"""`memlens mcp`: serve memlens's analyses (info, peak cause, sites, diff, simulate, predict) to an AI
assistant as a Model Context Protocol server over stdio (`memlens.mcp_server`; needs ``memlens[mcp]``)."""
from __future__ import annotations


def register(sub) -> None:
    from memlens.install_hint import extra_install_command
    p = sub.add_parser("mcp", help="serve memlens's analyses to AI assistants (Model Context Protocol, stdio)",
                       description="Run a Model Context Protocol server on stdin/stdout with the tools info, "
                                   "peak_cause, sites, diff, simulate and predict; each takes trace paths and "
                                   "answers JSON (bytes, ns). The tools read and run only files inside the "
                                   "server's roots: the client's roots (else the working directory) plus each "
                                   f"--root DIR. Needs the mcp extra: {extra_install_command('mcp')}.")
    p.add_argument("--root", action="append", default=[], metavar="DIR",
                   help="a directory whose files the tools may also read and run (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.mcp_server import require_mcp, serve

    require_mcp()  # a missing extra is bad input: one line saying how to install it
    serve(roots=args.root)
    return 0
