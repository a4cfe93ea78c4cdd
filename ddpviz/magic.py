"""The %%ddp cell magic: run a notebook cell on N long-lived ranks, like ipyparallel's %%px.

`%load_ext ddpviz`, then `%%ddp -n 2 [--backend gloo] [--timeout S]` sends the cell's source to
every rank of a pool (see ddpviz.launcher.pool); variables persist between cells. `%ddp_stop`
(or `%%ddp --stop`) ends the pool; it also ends when the kernel exits.

`%%ddp --debug` starts the ranks with the debugger on; `dbg = %ddp_debugger` is its `Debugger`
(ddpviz.launcher.pool_debugger): a cell returns once every rank has stopped at a break, and
`dbg.resume()` runs the rest of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ddpviz.launcher.pool import RankPool

if TYPE_CHECKING:
    from ddpviz.launcher.pool_debugger import PoolDebugger
    from ddpviz.session.live import Session

_DEFAULT_NPROCS = 2


@magics_class
class DDPMagics(Magics):
    """%%ddp and %ddp_stop; holds the current rank pool."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.pool: RankPool | None = None

    @magic_arguments()
    @argument("-n", "--nprocs", type=int, default=None,
              help="number of ranks (default: the running pool's, else 2)")
    @argument("--backend", default=None, help="gloo or nccl (default: nccl with a GPU per rank)")
    @argument("--timeout", type=float, default=None,
              help="seconds; ranks still running then are stopped with the pool")
    @argument("--session", default=None, metavar="NAME",
              help="stream the ranks' events into this Session variable (from ddpviz.listen()) "
                   "when the pool starts; default: the pool's own, see %%ddp_session")
    @argument("--debug", action="store_true",
              help="start the ranks with the debugger on (restarts a pool started without it); "
                   "dbg = %%ddp_debugger then pauses, inspects and resumes them")
    @argument("--stop", action="store_true", help="stop the pool instead of running the cell")
    @cell_magic
    def ddp(self, line: str, cell: str) -> None:
        """Run this cell on every rank of the pool (started on first use)."""
        opts = parse_argstring(self.ddp, line)
        if opts.stop:
            self._stop()
            return
        if opts.nprocs is not None and opts.nprocs < 1:
            raise ValueError(f"ddpviz: -n must be a positive number of ranks, got {opts.nprocs}."
                             "\nUse e.g. %%ddp -n 2.")
        if self.pool is not None and self.pool.alive:
            self.pool.check_not_parked()  # before any restart: the parked cell comes first
        pool = self._pool_for(opts.nprocs, opts.backend, self._session(opts.session),
                              opts.debug)
        try:
            pool.run_cell(cell, timeout=opts.timeout)
        except KeyboardInterrupt:
            print("ddpviz: interrupted; the ranks were stopped and their variables are gone. "
                  "The next %%ddp cell starts fresh ranks.")
            raise

    @line_magic
    def ddp_session(self, line: str = "") -> Session | None:
        """The live Session the %%ddp ranks stream their events into (None: no ranks yet)."""
        return None if self.pool is None else self.pool.session

    @line_magic
    def ddp_debugger(self, line: str = "") -> PoolDebugger:
        """The debugger of the %%ddp ranks (started with %%ddp --debug): dbg = %ddp_debugger."""
        from ddpviz.debugger.client import DebuggerError

        pool = self.pool
        if pool is None or not pool.alive:
            raise DebuggerError("ddpviz: no %%ddp ranks are running, so there is nothing to "
                                "debug.\nStart them with the debugger on: a cell beginning "
                                "%%ddp --debug.")
        if pool.debugger is None:
            raise DebuggerError("ddpviz: the %%ddp ranks were started without the debugger.\n"
                                "Restart them with it: a cell beginning %%ddp --debug (variables "
                                "from earlier cells are lost).")
        return pool.debugger

    @line_magic
    def ddp_stop(self, line: str = "") -> None:
        """Stop the %%ddp ranks (their variables are lost)."""
        self._stop()

    def _session(self, name: str | None) -> Session | None:
        if name is None:
            return None
        from ddpviz.session.live import Session

        value = self.shell.user_ns.get(name) if self.shell is not None else None
        if not isinstance(value, Session):
            found = "nothing" if value is None else type(value).__name__
            raise ValueError(f"ddpviz: --session {name} names {found}, not a ddpviz Session.\n"
                             f"Create one first: {name} = ddpviz.listen()")
        return value

    def _pool_for(self, nprocs: int | None, backend: str | None,
                  session: Session | None, debug: bool = False) -> RankPool:
        pool = self.pool
        if pool is not None and pool.alive:
            same_n = nprocs is None or nprocs == pool.nprocs
            same_backend = backend is None or backend == pool.backend
            same_session = session is None or session is pool.session
            same_debug = not debug or pool.debug
            if same_n and same_backend and same_session and same_debug:
                return pool
            print(f"ddpviz: restarting the ranks as {nprocs or pool.nprocs} x "
                  f"{backend or pool.backend}{' with the debugger' if debug else ''} (was "
                  f"{pool.nprocs} x {pool.backend}{' with the debugger' if pool.debug else ''}"
                  f"{'' if same_session else ', another session'}); variables from earlier "
                  "%%ddp cells are gone.")
            pool.stop()
        # a pool that ended (a crash, a timeout, the debugger's abort) comes back as it was
        debug = debug or (pool is not None and pool.debug)
        self.pool = RankPool(nprocs or (pool.nprocs if pool else _DEFAULT_NPROCS), backend,
                             session=session, debug=debug)
        with_debugger = " with the debugger (dbg = %ddp_debugger)" if debug else ""
        print(f"ddpviz: started {self.pool.nprocs} ranks ({self.pool.backend}){with_debugger}, "
              f"pids {self.pool.pids}")
        return self.pool

    def _stop(self) -> None:
        pool, self.pool = self.pool, None
        if pool is None or not pool.alive:
            print("ddpviz: no %%ddp ranks are running.")
            return
        pool.stop()
        print(f"ddpviz: stopped {pool.nprocs} ranks.")


_registered: dict[int, DDPMagics] = {}


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext ddpviz`: register %%ddp and %ddp_stop."""
    if id(ipython) in _registered:
        return
    magics = DDPMagics(ipython)
    ipython.register_magics(magics)
    _registered[id(ipython)] = magics


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext ddpviz`: stop the ranks."""
    magics = _registered.pop(id(ipython), None)
    if magics is not None and magics.pool is not None:
        magics.pool.stop()
