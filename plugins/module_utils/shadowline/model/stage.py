"""Stage the pinned model into local_dir, verified, atomically: ``ensure_model`` and ``remove_model``.

Layout beside ``local_dir`` (same filesystem, so renames are atomic)::

    <parent>/<name>/                              the model; only ever appears complete
    <parent>/<name>/shadowline-manifest.json      what is in it (see manifest.py)
    <parent>/.<name>.staging-<revision>/          staging in progress (resumable, journal inside)
    <parent>/.shadowline-model-<name>.status.json status for controllers (see status.py)
    <parent>/.shadowline-model-<name>.lock        flock held while a run changes anything

A run:
 1. refuses by policy what it can from the spec alone (unpinned revision, pickle format);
 2. if local_dir holds this model and revision, verifies it (fast: stat keys; full: rehash):
    clean means Ready with no network access at all;
 3. otherwise lists the source (metadata only), selects files, refuses pickles, checks free space
    for what is still missing; in check mode it stops here and reports;
 4. stages into ``.<name>.staging-<rev>``: files already journaled there (or verified in a damaged
    local_dir, which is moved back to staging) are kept, the rest fetched and hashed, each file
    checked against what the source says (size, sha256 / git blob id, safetensors header);
 5. writes the manifest, fsyncs, swaps the staging directory into place, writes status Ready.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import fetch_file, fetch_hf, fetch_rsync
from .errors import BusyError, ModelError, SpecError, VerifyError
from .fsutil import (
    DirLock,
    fsync_dir,
    human_bytes,
    make_tree_readable,
    makedirs_readable,
    remove_tree,
    swap_into_place,
)
from .hashing import COUNTERS, FileDigest, hash_files
from .hf_token import read_token_file, redact
from .journal import JOURNAL_NAME, Journal
from .manifest import FileEntry, Manifest, load_manifest, manifest_path, save_manifest
from .plan import Plan, RemoteFile
from .policy import (
    MANIFEST_NAME,
    check_free_space,
    check_selection,
    check_spec,
    is_weight,
    patterns_for,
    safe_relpath,
    select_files,
)
from .progress import ProgressCallback, ProgressReport, ProgressTracker
from .safetensors_header import check_index, check_safetensors
from .spec import ModelSpec, is_pinned
from .stage_result import StageResult, file_lines, manifest_view
from .status import DOWNLOADING, FAILED, PENDING, READY, ModelStatus, write_status
from .verify import VerifyReport, list_files, verify_dir

FETCHERS: dict[str, ModuleType] = {
    "file": fetch_file,
    "hf": fetch_hf,
    "rsync": fetch_rsync,
    "rsync+ssh": fetch_rsync,
}


class _Run:
    def __init__(
        self,
        spec: ModelSpec,
        token: str | None,
        *,
        check_mode: bool,
        progress: ProgressCallback | None,
        progress_interval: float,
    ) -> None:
        self.spec = spec
        self.token = token
        self.check_mode = check_mode
        self.user_progress = progress
        self.progress_interval = progress_interval
        self.fetcher = FETCHERS[spec.source.scheme]
        self.patterns = list(patterns_for(spec))
        self.actions: list[str] = []
        self.notes: list[str] = []
        self.target_revision: str | None = spec.revision
        self.status_written = False
        self._lock = threading.Lock()
        self._new: dict[str, FileEntry] = {}
        self._failures: dict[str, str] = {}
        self._hashed_start = COUNTERS.snapshot()[1]

    # -- status ---------------------------------------------------------------------------------
    def status(self, state: str, **kwargs: Any) -> None:
        if self.check_mode:
            return
        record = ModelStatus(
            state=state,
            model_id=self.spec.model_id,
            revision=kwargs.pop("revision", self.target_revision),
            local_dir=self.spec.local_dir,
            **kwargs,
        )
        write_status(self.spec.status_path, record, durable=state in (READY, FAILED))
        self.status_written = True

    def _on_progress(self, report: ProgressReport) -> None:
        self.status(DOWNLOADING, progress=report.as_dict())
        if self.user_progress is not None:
            self.user_progress(report)

    def fail(self, exc: BaseException) -> None:
        if self.check_mode:
            return
        # The status file is world-readable and gates print it: neither the token nor its file's path goes there.
        message = redact(str(exc) or type(exc).__name__, [self.token or "", self.spec.hf_token_file or ""])
        try:
            self.status(FAILED, error=message)
        except OSError:
            pass

    # -- helpers --------------------------------------------------------------------------------
    def result(self, changed: bool, state: str, manifest: Manifest | None, **kwargs: Any) -> StageResult:
        hashed = COUNTERS.snapshot()[1]
        return StageResult(
            changed=changed,
            state=state,
            model_id=self.spec.model_id,
            revision=manifest.revision if manifest else self.target_revision,
            digest=manifest.digest if manifest else None,
            total_bytes=manifest.total_bytes if manifest else kwargs.pop("total_bytes", 0),
            weight_bytes=manifest.weight_bytes if manifest else kwargs.pop("weight_bytes", 0),
            files=len(manifest.files) if manifest else kwargs.pop("files", 0),
            local_dir=self.spec.local_dir,
            manifest_path=manifest_path(self.spec.local_dir),
            status_path=self.spec.status_path,
            actions=self.actions,
            notes=self.notes,
            hashed_bytes=hashed - self._hashed_start,
            **kwargs,
        )

    def load_current(self) -> tuple[Manifest | None, bool]:
        """(manifest, owned): owned is False for a non-empty local_dir shadowline did not create."""
        local = self.spec.local_dir
        if os.path.islink(local):
            raise SpecError(
                f"gms_model.local_dir {local} is a symlink; staging replaces the directory and would orphan its target.",
                field="gms_model.local_dir",
                fix=f"set gms_model.local_dir to the real path ({os.path.realpath(local)}).",
            )
        if not os.path.isdir(local):
            if os.path.lexists(local):
                raise SpecError(
                    f"gms_model.local_dir {local} exists and is not a directory.",
                    field="gms_model.local_dir",
                    fix="remove it or choose another path.",
                )
            return None, True
        try:
            manifest = load_manifest(local)
        except VerifyError as exc:
            self.notes.append(f"{exc.message} Restaging.")
            return None, True
        if manifest is None and os.listdir(local):
            return None, False
        return manifest, True

    def expected_problem(self, rf: RemoteFile, digest: FileDigest, path: str) -> str | None:
        if rf.size is not None and digest.size != rf.size:
            return f"size {digest.size} != {rf.size} listed by the source"
        if rf.sha256 and digest.sha256 != rf.sha256:
            return f"sha256 {digest.sha256[:12]}… != {rf.sha256[:12]}… listed by the source"
        if rf.git_oid and digest.git_sha1 and digest.git_sha1 != rf.git_oid:
            return f"git blob id {digest.git_sha1[:12]}… != {rf.git_oid[:12]}… listed by the source"
        if rf.path.endswith(".safetensors"):
            reason = check_safetensors(path)
            if reason:
                return reason
        return None

    def on_done(
        self, tracker: ProgressTracker, journal: Journal, staging: str
    ) -> Callable[[RemoteFile, FileDigest], None]:
        def done(rf: RemoteFile, digest: FileDigest) -> None:
            path = os.path.join(staging, rf.path)
            problem = self.expected_problem(rf, digest, path)
            if problem:
                with self._lock:
                    self._failures[rf.path] = problem
                try:
                    os.unlink(path)
                except OSError:
                    pass
                return
            entry = FileEntry(rf.path, digest.size, digest.sha256).with_stat(os.stat(path))
            journal.append(entry)
            with self._lock:
                self._new[rf.path] = entry
            tracker.file_done()

        return done

    def prune(self, staging: str, keep: set[str], wanted: set[str], final: bool) -> None:
        """Remove from staging what must not survive: unwanted files, stale partials, tool metadata."""
        tool_dirs = {".cache", fetch_rsync.PARTIAL_DIR}
        for rel in list_files(staging):
            top = rel.split("/", 1)[0]
            if rel == JOURNAL_NAME and not final:
                continue
            if top in tool_dirs and not final and self.fetcher.REUSES_PARTIAL:
                continue
            if rel in keep:
                continue
            if rel in wanted and not final and self.fetcher.REUSES_PARTIAL:
                continue  # the tool decides whether it is complete; it is hashed afterwards
            os.unlink(os.path.join(staging, rel))
        if final:
            for top in tool_dirs:
                remove_tree(os.path.join(staging, top))
        for dirpath, _dirnames, _files in sorted(os.walk(staging), key=lambda t: -len(t[0])):
            if dirpath != staging and not os.listdir(dirpath):
                os.rmdir(dirpath)

    def remove_stale(self, staging: str) -> None:
        parent = self.spec.parent
        for name in os.listdir(parent):
            path = os.path.join(parent, name)
            if name.startswith(self.spec.staging_prefix) and path != staging:
                remove_tree(path)
                self.actions.append(f"removed stale staging directory {path}")
        if os.path.lexists(self.spec.aside_dir):
            remove_tree(self.spec.aside_dir)

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> StageResult:
        spec = self.spec
        current, owned = self.load_current()
        if not owned:
            raise SpecError(
                f"gms_model.local_dir {spec.local_dir} exists, is not empty and has no {MANIFEST_NAME}: "
                "it was not staged by shadowline.",
                field="gms_model.local_dir",
                fix="move its content away (it is never deleted automatically), or choose another gms_model.local_dir.",
            )
        before = manifest_view(current) if current else None

        plan: Plan | None = None
        if not is_pinned(spec.revision):
            # An unpinned revision means whatever the source holds now: ask it first.
            plan = self.fetcher.plan(spec, self.token)
            self.target_revision = plan.revision
        report: VerifyReport | None = None
        same = (
            current is not None
            and current.model_id == spec.model_id
            and current.revision == self.target_revision
            and current.format == spec.format
        )
        if current is not None and same:
            report = verify_dir(spec.local_dir, current, spec.verify, workers=spec.workers or None)
            if report.clean and current.patterns == self.patterns:
                return self.ready_unchanged(current, report, before)
            if not report.clean:
                self.actions.append(
                    f"{len(report.bad) + len(report.extra)} file(s) failed {spec.verify} verification: "
                    + "; ".join(report.problems(5))
                )
        elif current is not None:
            self.actions.append(
                f"replace {current.model_id}@{current.revision} with {spec.model_id}@{self.target_revision}"
            )

        if plan is None:
            plan = self.fetcher.plan(spec, self.token)
            self.target_revision = plan.revision
        self.notes.extend(plan.notes)
        listed = [safe_relpath(f.path) for f in plan.files]
        selected = select_files(listed, self.patterns)
        check_selection(spec, listed, selected)
        wanted = {f.path: f for f in plan.files if f.path in set(selected)}
        staging = spec.staging_dir(plan.revision)

        if report is not None and report.clean and current is not None and set(current.by_path()) == set(wanted):
            # Only the pattern list changed and it selects the same files: record it, nothing to fetch.
            if not self.check_mode:
                current.patterns = list(self.patterns)
                save_manifest(spec.local_dir, current)
            return self.ready_unchanged(current, report, before)

        reusable: dict[str, FileEntry] = {}
        if report is not None:
            reusable = {p: e for p, e in report.ok.items() if p in wanted and self.matches(wanted[p], e)}
            self.actions.append(
                f"repair {spec.local_dir} in place: keep {len(reusable)} verified files, "
                f"fetch {len(wanted) - len(reusable)}, drop {len(set(report.ok) - set(reusable)) + len(report.extra)}"
            )
        elif os.path.isdir(staging):
            journal = Journal(staging, spec.model_id, plan.revision)
            reusable = {p: e for p, e in journal.load().items() if p in wanted and self.matches(wanted[p], e)}
            self.actions.append(f"resume staging in {staging}: {len(reusable)} of {len(wanted)} files already staged")
        to_fetch = [rf for p, rf in sorted(wanted.items()) if p not in reusable]
        unsized = [rf.path for rf in to_fetch if rf.size is None]
        if unsized:
            self.notes.append(
                f"the source gave no size for {len(unsized)} file(s); the free-space check leaves them out"
            )
        needed = sum(rf.size or 0 for rf in to_fetch)
        total = sum(rf.size or 0 for rf in wanted.values())
        self.actions.append(
            f"fetch {len(to_fetch)} of {len(wanted)} files ({human_bytes(needed)} of {human_bytes(total)}) "
            f"from {spec.source.uri} at {plan.revision}"
        )
        check_free_space(spec.parent, needed, len(to_fetch))
        after_view = {
            "model_id": spec.model_id,
            "revision": plan.revision,
            "digest": None,
            "files": len(wanted),
            "total_bytes": total,
            "file_list": file_lines([(p, rf.size, rf.sha256) for p, rf in sorted(wanted.items())]),
        }
        if self.check_mode:
            return self.result(
                True,
                PENDING,
                None,
                total_bytes=total,
                weight_bytes=sum(rf.size or 0 for p, rf in wanted.items() if is_weight(p)),
                files=len(wanted),
                before=before,
                after=after_view,
                repaired=sorted(set(report.bad) | set(report.extra)) if report else [],
                fetched_bytes=needed,  # check mode: what a real run would fetch
            )
        return self.stage(plan, wanted, reusable, to_fetch, staging, report, before)

    def matches(self, rf: RemoteFile, entry: FileEntry) -> bool:
        if rf.size is not None and rf.size != entry.size:
            return False
        return not (rf.sha256 and rf.sha256 != entry.sha256)

    def ready_unchanged(self, current: Manifest, report: VerifyReport, before: dict[str, Any] | None) -> StageResult:
        if report.refreshed and not self.check_mode:
            refreshed = report.ok
            current.files = [refreshed.get(e.path, e) for e in current.files]
            save_manifest(self.spec.local_dir, current)
            self.notes.append(f"refreshed stat keys of {len(report.rehashed)} file(s) whose content was unchanged")
        self.target_revision = current.revision
        self.status(READY, digest=current.digest, total_bytes=current.total_bytes, files=len(current.files))
        return self.result(False, READY, current, before=before, after=before, verify_seconds=report.seconds)

    def stage(  # noqa: PLR0915 (over the size limits of pyproject.toml; split it when it changes next)
        self,
        plan: Plan,
        wanted: dict[str, RemoteFile],
        reusable: dict[str, FileEntry],
        to_fetch: list[RemoteFile],
        staging: str,
        report: VerifyReport | None,
        before: dict[str, Any] | None,
    ) -> StageResult:
        spec = self.spec
        self.status(PENDING)
        self.remove_stale(staging)
        repaired: list[str] = []
        if report is not None:
            # Demote the damaged local_dir to staging: it no longer looks complete while it is repaired.
            # The journal of the files kept is written first, so a kill right after the rename keeps them.
            remove_tree(staging)
            Journal(spec.local_dir, spec.model_id, plan.revision).start(reusable.values())
            os.rename(spec.local_dir, staging)
            fsync_dir(spec.parent)
            for rel in sorted(set(report.bad) | set(report.extra)):
                try:
                    os.unlink(os.path.join(staging, rel))
                except FileNotFoundError:
                    pass
            repaired = sorted(set(report.bad) | set(report.extra) | (set(wanted) - set(reusable)))
        os.makedirs(staging, exist_ok=True)
        journal = Journal(staging, spec.model_id, plan.revision)
        journal.start(reusable.values())
        self.prune(staging, keep=set(reusable), wanted=set(wanted), final=False)

        needed = sum(rf.size or 0 for rf in to_fetch)
        tracker = ProgressTracker(
            "download", needed, len(to_fetch), callback=self._on_progress, interval=self.progress_interval
        )
        self.status(DOWNLOADING, progress=tracker.report().as_dict())
        start = time.monotonic()
        self.fetcher.fetch(spec, self.token, plan, to_fetch, staging, tracker, self.on_done(tracker, journal, staging))
        fetch_seconds = time.monotonic() - start
        tracker.finish()
        if self._failures:
            shown = "; ".join(f"{p}: {r}" for p, r in sorted(self._failures.items())[:5])
            raise VerifyError(
                f"{len(self._failures)} fetched file(s) failed verification and were discarded: {shown}.",
                field="gms_model.source",
                fix="re-run to fetch them again (verified files are kept); if it persists the source copy is damaged.",
            )
        entries = dict(reusable)
        entries.update(self._new)
        missing = sorted(set(wanted) - set(entries))
        if missing:
            raise VerifyError(
                f"{len(missing)} file(s) were not fetched: {', '.join(missing[:5])}.",
                field="gms_model.source",
                fix="re-run; check the source lists them.",
            )

        verify_start = time.monotonic()
        if spec.verify == "full":
            vtracker = ProgressTracker(
                "verify",
                sum(e.size for e in entries.values()),
                len(entries),
                callback=self._on_progress,
                interval=self.progress_interval,
            )
            digests = hash_files(staging, list(entries), workers=spec.workers or None, on_bytes=vtracker.add_bytes)
            bad = sorted(p for p, e in entries.items() if digests[p].sha256 != e.sha256)
            vtracker.finish()
            if bad:
                for rel in bad:
                    os.unlink(os.path.join(staging, rel))
                raise VerifyError(
                    f"full verification of the staged copy failed for {', '.join(bad[:5])} (read back differs).",
                    field="gms_model_verify",
                    fix="check this node's disk/memory; re-run to fetch those files again.",
                )
        problems = []
        for rel in entries:
            if rel.endswith(".safetensors"):
                reason = check_safetensors(os.path.join(staging, rel))
                if reason:
                    problems.append(f"{rel}: {reason}")
            if rel.endswith(".safetensors.index.json"):
                reason = check_index(os.path.join(staging, rel), set(entries), rel)
                if reason:
                    problems.append(f"{rel}: {reason}")
        if problems:
            raise VerifyError(
                f"staged model is inconsistent: {'; '.join(problems[:5])}.",
                field="allow_patterns" if spec.allow_patterns else "gms_model.source",
                fix="make allow_patterns select every shard, or fix the source.",
            )
        self.prune(staging, keep=set(entries), wanted=set(wanted), final=True)
        # Readable by the engines' service user whatever this run's umask; before the stat keys are recorded.
        make_tree_readable(staging)
        final_entries = [entries[p].with_stat(os.stat(os.path.join(staging, p))) for p in sorted(entries)]
        manifest = Manifest(
            model_id=spec.model_id,
            revision=plan.revision,
            source=spec.source.uri,
            format=spec.format,
            files=final_entries,
            patterns=list(self.patterns),
            requested_revision=spec.revision,
        )
        save_manifest(staging, manifest)
        fsync_dir(staging)
        verify_seconds = time.monotonic() - verify_start
        swap_into_place(staging, spec.local_dir, spec.aside_dir)
        self.actions.append(f"staged {spec.model_id}@{plan.revision} into {spec.local_dir} ({manifest.digest[:19]}…)")
        self.status(READY, digest=manifest.digest, total_bytes=manifest.total_bytes, files=len(manifest.files))
        return self.result(
            True,
            READY,
            manifest,
            before=before,
            after=manifest_view(manifest),
            repaired=repaired,
            fetched_bytes=needed,
            fetch_seconds=fetch_seconds,
            verify_seconds=verify_seconds,
        )


def _token(spec: ModelSpec) -> str | None:
    if spec.source.scheme == "hf" and spec.hf_token_file:
        return read_token_file(spec.hf_token_file)
    return None


def ensure_model(
    spec: ModelSpec,
    *,
    check_mode: bool = False,
    progress: ProgressCallback | None = None,
    progress_interval: float = 2.0,
) -> StageResult:
    """Make local_dir hold exactly the pinned model, verified; see the module docstring.

    In check mode nothing is written (no status file, no lock, no download); the result says what
    would change. Raises ``ModelError`` subclasses with the field and fix; the status file is set
    to Failed with the (token-free) message.
    """
    if check_mode:
        check_spec(spec)
        run = _Run(spec, _token(spec), check_mode=True, progress=progress, progress_interval=progress_interval)
        return run.run()
    try:
        makedirs_readable(spec.parent)
    except OSError as exc:
        raise SpecError(
            f"cannot create {spec.parent}: {exc.strerror}.", field="gms_model.local_dir", fix="choose a writable path."
        ) from exc
    lock = DirLock(spec.lock_path)
    if not lock.acquire():
        raise BusyError(
            f"another staging of {spec.local_dir} is running (pid {lock.holder()}).",
            field="gms_model.local_dir",
            fix="wait for it (its progress is in the status file) or stop it; then re-run.",
        )
    token: str | None = None
    run = _Run(spec, None, check_mode=False, progress=progress, progress_interval=progress_interval)
    try:
        try:
            # Refusals are recorded as Failed too: a node whose pin could not be applied must not pass the gate.
            check_spec(spec)
            token = run.token = _token(spec)
            return run.run()
        except BaseException as exc:
            run.fail(exc)
            if isinstance(exc, ModelError) or not isinstance(exc, Exception):
                raise
            raise ModelError(
                redact(f"staging {spec.model_id} failed: {type(exc).__name__}: {exc}", [token or ""]),
                field="gms_model",
                fix="re-run (verified files are kept); see the status file for details.",
            ) from exc
    finally:
        lock.release()


def remove_model(spec: ModelSpec, *, check_mode: bool = False) -> StageResult:
    """Remove local_dir (only if shadowline staged it), staging leftovers and the status file."""
    run = _Run(spec, None, check_mode=check_mode, progress=None, progress_interval=2.0)
    current, owned = run.load_current()
    if not owned:
        raise SpecError(
            f"gms_model.local_dir {spec.local_dir} has no {MANIFEST_NAME}; refusing to delete what shadowline did not stage.",
            field="gms_model.local_dir",
            fix="remove it by hand if it is really unused.",
        )
    targets = []
    if os.path.lexists(spec.local_dir):
        targets.append(spec.local_dir)
    if os.path.isdir(spec.parent):
        targets += [
            os.path.join(spec.parent, n)
            for n in sorted(os.listdir(spec.parent))
            if n.startswith(spec.staging_prefix) or os.path.join(spec.parent, n) == spec.aside_dir
        ]
    for extra in (spec.status_path, spec.lock_path):
        if os.path.lexists(extra):
            targets.append(extra)
    run.actions.extend(f"remove {t}" for t in targets)
    if not check_mode:
        for target in targets:
            remove_tree(target)
    before = manifest_view(current) if current else None
    result = run.result(bool(targets), "Absent", None, before=before, after=None)
    result.revision = current.revision if current else None
    return result
