"""Assembling a running Lockgate process: database, sandbox, tools, engine, lease, recovery.

`Runtime.start()` is what every process does on boot: open (and, for the embedded SQLite
default, migrate) the database, register a new incarnation, recover dead instances' work,
and start the maintenance loop (heartbeat, recovery, expiry sweep, pending work).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from lockgate.machine.db.migrate import prepare_database
from lockgate.machine.db.store import SqlStore
from lockgate.machine.engine import Engine
from lockgate.machine.faults import Faults, for_server
from lockgate.machine.instances import InstanceLease
from lockgate.machine.ledger import Ledger
from lockgate.machine.people import People
from lockgate.machine.policy import Policy
from lockgate.machine.policy_book import PolicyBook
from lockgate.machine.recovery import Recovery, RecoveryReport
from lockgate.machine.sandbox import Sandbox, SandboxLimits
from lockgate.machine.secret_store import SecretCipher, StoredSecrets
from lockgate.machine.secrets import SecretStore
from lockgate.machine.sessions import Sessions
from lockgate.machine.settings import Settings
from lockgate.machine.source_book import SourceBook
from lockgate.machine.source_catalog import SourceCatalog
from lockgate.machine.storage import purge_finished
from lockgate.machine.tools.admin_source import AdminSource
from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.tools.plugins import installed_sources
from lockgate.machine.tools.registry import ToolRegistry, ToolSource
from lockgate.machine.write_path import WritePath
from lockgate.spec.session_lease import LeasePolicy

if TYPE_CHECKING:
    from lockgate.machine.db.connect import Database
    from lockgate.machine.tools.http_calls import HttpLimits

log = logging.getLogger("lockgate.runtime")


def default_instance_name(settings: Settings) -> str:
    return settings.instance_name or f"{socket.gethostname()}:{settings.database_url}"[:200]


def configured_sources(
    settings: Settings,
    sources: list[ToolSource] | None = None,
    secrets: SecretStore | None = None,
) -> tuple[list[ToolSource], frozenset[str]]:
    """The sources a server with `settings` serves: `sources` (default: the built-in notes
    and every installed plugin's), then those of the operator's sources file; and the names
    of those the file exposes directly as MCP tools (`expose = "direct"`)."""
    chosen: list[ToolSource] = (
        list(sources) if sources is not None else [NotesSource(settings.notes_dir)]
    )
    if sources is None:  # installed plugins' sources, as every server has them
        chosen += installed_sources()
    direct: frozenset[str] = frozenset()
    if settings.sources_file is not None:  # the operator's, next to those given
        # Imported here: the source kinds (GraphQL, OpenAPI, MCP) cost a boot without
        # a sources file nothing.
        from lockgate.machine.tools.source_file import load_sources

        loaded = load_sources(settings.sources_file, http_limits(settings), secrets)
        chosen += loaded
        direct = loaded.direct
    return chosen, direct


def http_limits(settings: Settings) -> HttpLimits:
    from lockgate.machine.tools.http_calls import HttpLimits  # only once a source calls out

    return HttpLimits(
        timeout_secs=settings.http_timeout_secs,
        max_response_bytes=settings.http_max_response_bytes,
        max_redirects=settings.http_max_redirects,
        document_bytes=settings.max_source_document_bytes,
        catalogues=settings.catalogue_dir,
    )


def source_catalog(
    settings: Settings,
    store: SqlStore,
    configured: list[ToolSource],
    secrets: SecretStore,
    *,
    admin: AdminSource | None = None,
) -> SourceCatalog:
    """The stored sources (and the book serving each principal's tools) on top of the
    `configured` ones; `admin`, the `tools.lockgate` source among them, works on it."""
    # Made first, built through the catalog made next (each needs the other).
    builder: list[SourceCatalog] = []
    book = SourceBook(
        configured,
        store.sources,
        lambda row: builder[0].build(row),
        settings.sources_refresh_secs,
    )
    catalog = SourceCatalog(
        store.sources,
        book,
        http_limits(settings),
        secrets,
        settings.max_sources_per_principal,
        allowed_networks=settings.allowed_networks,
    )
    builder.append(catalog)
    if admin is not None:
        admin.bind(catalog)
    return catalog


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    lease: InstanceLease
    recovery: Recovery
    sandbox: Sandbox
    #: The configured sources (every principal's), and the stored ones (`catalog.book`).
    sources: list[ToolSource]
    catalog: SourceCatalog
    registry: ToolRegistry
    #: The configured sources whose tools are MCP tools too (`expose = "direct"`).
    direct: frozenset[str]
    sessions: Sessions
    ledger: Ledger
    #: People who approve: approvers, enrolment links, signed-in sessions.
    people: People
    boot_report: RecoveryReport | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    #: Set when this incarnation learned it was declared dead: it must stop working.
    fenced: threading.Event = field(default_factory=threading.Event)
    #: Set once draining began: no new work is claimed.
    draining: threading.Event = field(default_factory=threading.Event)
    #: When the drain's bound passes (time.monotonic()), once it began.
    drain_deadline: float | None = None
    _drain_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(
        cls,
        settings: Settings | None = None,
        *,
        sources: list[ToolSource] | None = None,
        secrets: SecretStore | None = None,
        faults: Faults | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        database: Database | None = None,
        sandboxes: Callable[..., Sandbox] = Sandbox,
    ) -> Runtime:
        """`database`: an engine already open on `settings.database_url` (the simulator
        keeps one per simulated database across the incarnations that use it). `sandboxes`
        makes the sandbox, from `Sandbox`'s arguments (the simulator hands an idle one of
        an earlier incarnation back out: starting and stopping its worker processes was a
        sixth of a simulated run)."""
        settings = settings or Settings()
        store = SqlStore(prepare_database(settings, database))
        try:
            if secrets is None:
                stored = StoredSecrets(store.secrets, SecretCipher.from_settings(settings))
                stored.check_startable()  # stored secrets and no key: refuse to start
                secrets = stored
            admin = AdminSource()
            configured, direct = configured_sources(settings, sources, secrets)
            chosen = [*configured, admin]
            catalog = source_catalog(settings, store, chosen, secrets, admin=admin)
        except Exception:
            store.engine.dispose()  # a runtime that cannot start holds no connection
            raise
        registry = catalog.book.base
        sandbox = sandboxes(
            registry.namespace(),
            SandboxLimits(
                max_duration_secs=settings.max_duration_secs,
                max_memory_bytes=settings.max_memory_bytes,
                max_recursion_depth=settings.max_recursion_depth,
                max_calls=settings.max_calls,
                # The user's limits, applied once, in the sandbox: the engine's own cut of
                # the same size is then a no-op instead of cutting a truncation marker.
                max_output_bytes=settings.max_result_bytes,
                max_log_chars=settings.max_log_chars,
            ),
            max_processes=settings.sandbox_workers,
            max_per_principal=settings.max_workers_per_principal,
        )
        if faults is None:
            faults = for_server(settings.fault_injection)
        # The store and the one write path first: the instance lease registers through
        # them, so everything built after it knows the owner it writes as.
        write = WritePath(
            store, faults=faults, clock=clock, conservative=settings.conservative_recovery
        )
        lease = InstanceLease(
            store, write, name=default_instance_name(settings), ttl=settings.lease_ttl, clock=clock
        )
        lease.register()
        recovery = Recovery(store=store, write=write, lease=lease, clock=clock)
        engine = Engine(
            store=store,
            write=write,
            sandbox=sandbox,
            registry=catalog.book,
            policy=PolicyBook(
                Policy.from_text(settings.policy),
                store.policies.applying_to,
                settings.policy_refresh_secs,
            ),
            secrets=secrets,
            settings=settings,
            owner=lease.id,
            # An execution that fails here with a call in flight gets recovery's verdict.
            abandon=recovery.recover_execution,
            clock=clock,
        )
        ledger = Ledger(
            store=store, write=write, lease=lease, clock=clock, recover_executions=recovery.run
        )
        sessions = Sessions(
            store=store,
            write=write,
            lease=lease,
            policy=LeasePolicy(
                idle_timeout=settings.session_idle_timeout,
                lease=settings.session_lease,
                cap=settings.session_cap,
            ),
            clock=clock,
            live_counts=engine.live_counts,
            ledger=ledger,
        )
        return cls(
            settings=settings,
            engine=engine,
            lease=lease,
            recovery=recovery,
            sandbox=sandbox,
            sources=chosen,
            catalog=catalog,
            registry=registry,
            direct=direct,
            sessions=sessions,
            ledger=ledger,
            people=People(store=store, write=write, settings=settings, clock=clock),
        )

    def maintain(self, *, sweep: bool = True) -> RecoveryReport:
        """One maintenance round: renew the lease, recover dead instances' work and (with
        `sweep`) expire overdue approvals, approver sessions and enrolment links, and purge
        finished executions past the retention period. Never runs
        agent code, so the heartbeat is never late."""
        if not self.lease.heartbeat():
            self.fenced.set()
            log.error("this instance was declared dead by another; it stops working")
            return RecoveryReport()
        report = self.recovery.run()
        self.sessions.recover()
        if sweep:
            self.engine.expire_due()
            self.engine.webhooks.warn_due()
            self.people.expire_due()
            self.sessions.sweep()
            engine = self.engine
            purge_finished(engine.store, self.settings.finished_retention, engine.clock)
        return report

    def start(self, *, background: bool = True) -> RecoveryReport:
        """Boot: recover, then (in the background) keep maintaining and running pending work.
        Without `background`, pending work is run once, here.

        Ready means recovered: a dead incarnation's work and sessions are taken over here,
        before any request can race them. The sweeps (overdue approvals, sessions past their
        lease) are not recovery and scale with what the database holds (a thousand idle
        sessions took 2.5 s): in the background they run at once, after ready."""
        self.boot_report = self.maintain(sweep=not background)
        if background:
            self._threads = [
                threading.Thread(target=self._maintenance, name="lockgate-lease", daemon=True),
                threading.Thread(target=self._worker, name="lockgate-worker", daemon=True),
            ]
            if self.engine.webhooks.enabled:
                self._threads.append(
                    threading.Thread(
                        target=self._deliver_webhooks, name="lockgate-webhooks", daemon=True
                    )
                )
            for thread in self._threads:
                thread.start()
        else:
            self.engine.run_pending()
        return self.boot_report

    def _maintenance(self) -> None:
        interval = self.settings.heartbeat_interval.total_seconds()
        sweep_every = self.settings.sweep_interval.total_seconds()
        # The boot left the first sweep to this thread: it is due at once.
        last_sweep: float | None = None
        while not self.fenced.is_set() and not self._stop.is_set():
            due = last_sweep is None or time.monotonic() - last_sweep >= sweep_every
            try:
                self.maintain(sweep=due)
            except Exception:
                log.exception("maintenance round failed; retrying next round")
            if due:
                last_sweep = time.monotonic()
            if self._stop.wait(interval):
                return

    def _worker(self) -> None:
        """Run pending executions (new ones and those recovery requeued)."""
        interval = min(1.0, self.settings.heartbeat_interval.total_seconds())
        while not self._stop.is_set() and not self.fenced.is_set():
            if self.draining.is_set():
                self._stop.wait(interval)
                continue
            try:
                ran = self.engine.run_pending()
            except Exception:
                log.exception("running pending executions failed; retrying")
                ran = 0
            if not ran:
                self._stop.wait(interval)

    def _deliver_webhooks(self) -> None:
        """Send the outbox's due events (any instance's), polling as often as the worker,
        up to `LOCKGATE_WEBHOOK_CONCURRENCY` at once (one slow receiver holds one of them)."""
        interval = min(1.0, self.settings.heartbeat_interval.total_seconds())
        at_once = self.settings.webhook_concurrency
        pool = ThreadPoolExecutor(at_once, thread_name_prefix="lockgate-webhook")
        try:
            while not self._stop.is_set() and not self.fenced.is_set():
                try:
                    sent = self.engine.webhooks.deliver_due(pool=pool, at_once=at_once)
                except Exception:
                    log.exception("delivering webhook events failed; retrying")
                    sent = 0
                if not sent:
                    self._stop.wait(interval)
        finally:
            # An attempt in flight ends within its own bound (LOCKGATE_WEBHOOK_TIMEOUT).
            pool.shutdown(wait=False, cancel_futures=True)

    def drain(self) -> None:
        """Stop taking new work and hand back what runs; the lease is still renewed while
        what is owed is answered. Starts the drain's bound (`drain_timeout`), which `close`
        keeps. Once only: a second call (SIGTERM's, then the app's shutdown) waits for the
        first to finish, so nothing stops the lease before its drain was recorded.

        Running executions are handed back, not waited for: agent code may run until its
        time limit (minutes), while the platform SIGKILLs ~30 s after SIGTERM. Their code
        is stopped at once and each goes back to `pending` from its last checkpoint, for the
        next owner (this instance's next incarnation, or any other) to go on with."""
        with self._drain_lock:
            if self.draining.is_set():
                return
            self.drain_deadline = time.monotonic() + self.settings.drain_timeout.total_seconds()
            self.draining.set()
            stopped = self.engine.hand_back_all()
            if stopped:
                log.info("draining: stopped %d running sandbox steps to hand them back", stopped)
            if not self.fenced.is_set():
                self.lease.drain()

    def drain_left(self) -> float | None:
        """Seconds left of the drain's bound (None before the drain began)."""
        if self.drain_deadline is None:
            return None
        return max(0.0, self.drain_deadline - time.monotonic())

    def close(self) -> None:
        if not self.draining.is_set():
            self.drain()
        self._stop.set()
        # Within the drain's bound: the handed-back executions reach their next step at
        # once; one with a tool call in flight is waited for until the bound. What is left
        # then is recovery's: the instance records its stop, so the next incarnation (or any
        # instance) recovers it at once.
        if not self.engine.wait_idle(self.drain_left() or 0.0):
            log.warning(
                "the drain's bound (%s s) passed with tool calls in flight; their executions "
                "are left to recovery",
                self.settings.drain_timeout.total_seconds(),
            )
        for thread in self._threads:
            thread.join(timeout=self.drain_left())
        if not self.fenced.is_set():
            try:
                self.lease.stop()
            except Exception:
                log.exception("could not record a clean stop")
        self.sandbox.close()
        self.close_sources()

    def close_sources(self) -> None:
        self.catalog.book.close()
