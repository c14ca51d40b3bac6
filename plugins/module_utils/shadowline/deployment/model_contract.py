"""gms_model and its policy switches: which model, at which revision, from where, in which format, parsed into a
typed ``Model`` (contract.py's part), and the policy that refuses an unpinned revision or pickle weights unless
the inventory allows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.values import Reader, as_bool, describe
from ..model.errors import SpecError
from ..model.spec import DEFAULT_FORMAT, FORMATS, MODEL_ID_RE, PINNED_RE, parse_source

LOCAL_DIR_EXAMPLE = "/var/lib/shadowline/models/<name>/<revision>"
SAFE_FORMATS = ["safetensors"]
PICKLE_FORMATS = [f for f in FORMATS if f not in SAFE_FORMATS]
REVISION_RE = PINNED_RE
DEFAULT_MODEL: dict[str, Any] = {"id": None, "revision": None, "source": None, "local_dir": None, "format": DEFAULT_FORMAT}


@dataclass(frozen=True)
class Model:
    id: str
    revision: str
    source: str
    local_dir: str
    format: str

    @property
    def pinned(self) -> bool:
        return bool(REVISION_RE.match(self.revision))


def default_local_dir(model_id: str, revision: str) -> str:
    return f"/var/lib/shadowline/models/{model_id.replace('/', '--')}/{revision}"


def parse_model(read: Reader, shared: dict[str, Any]) -> Model | None:
    values = read.mapping("gms_model", shared.get("gms_model"), DEFAULT_MODEL)
    if shared.get("gms_model") is None:
        read.problem("gms_model", "is not set.", "set gms_model.id and gms_model.revision (a 40-hex commit).")
        return None
    model_id = read.string("gms_model.id", values["id"], "meta-llama/Llama-3.3-70B-Instruct")
    if model_id is not None and not MODEL_ID_RE.match(model_id):
        read.problem("gms_model.id", f"{model_id!r} is not a model id like org/name.",
                     "use the repository id, e.g. meta-llama/Llama-3.3-70B-Instruct.")
        model_id = None
    revision = values["revision"]
    if revision is None:
        revision_text = "main"
        if as_bool(shared.get("gms_model_allow_unpinned")) is not True:
            read.problem("gms_model.revision", "is not set, so the model is not pinned.",
                         "set it to the 40-hex commit id of the model repository "
                         "(or gms_model_allow_unpinned: true, which follows a moving branch).")
            revision_text = ""
    elif isinstance(revision, str):
        revision_text = revision.strip()
    else:
        read.problem("gms_model.revision", f"must be a string, got {describe(revision)}.",
                     "quote the 40-hex commit id in YAML so it stays a string.")
        revision_text = ""
    source = values["source"] or (f"hf://{model_id}" if model_id else None)
    source_text = _parse_source(read, source) if source else None
    model_format = read.choice("gms_model.format", values["format"], SAFE_FORMATS + PICKLE_FORMATS)
    local_dir = values["local_dir"] or (default_local_dir(model_id, revision_text) if model_id and revision_text else None)
    local_dir = read.path("gms_model.local_dir", local_dir, LOCAL_DIR_EXAMPLE) if local_dir else None
    if not (model_id and revision_text and source_text and model_format and local_dir):
        return None
    return Model(id=model_id, revision=revision_text, source=source_text, local_dir=local_dir, format=model_format)


def _parse_source(read: Reader, source: Any) -> str | None:
    """The source URI, checked by the staging library's own parser (one parser for both)."""
    if not isinstance(source, str):
        read.problem("gms_model.source", f"must be a URI string, got {describe(source)}.",
                     "use hf://<repo>, file:///<path> or rsync://<host>/<path>.")
        return None
    try:
        return parse_source(source, "").uri
    except SpecError as err:
        read.problem("gms_model.source", err.message.replace("gms_model.source ", "", 1).rstrip(".") + ".",
                     err.fix or "use hf://<repo>, file:///<path> or rsync://<host>/<path>.")
        return None


def check_model_policy(read: Reader, model: Model, allow_unpinned: bool | None, allow_pickle: bool | None) -> None:
    if not model.pinned and not allow_unpinned:
        read.problem("gms_model.revision", f"{model.revision!r} is not a pinned 40-hex commit id.",
                     "set the exact commit (git ls-remote or the hub's 'Files' page gives it), "
                     "or set gms_model_allow_unpinned: true to accept a moving revision.")
    if model.format in PICKLE_FORMATS and not allow_pickle:
        read.problem("gms_model.format", f"{model.format!r} weights are pickle files that can run code when loaded.",
                     "use safetensors weights, or set gms_model_allow_pickle: true if you trust the source.")
