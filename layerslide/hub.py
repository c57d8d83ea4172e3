"""Names on the Hugging Face Hub: a model id (`Qwen/Qwen3-8B`) resolved to its folder in
huggingface_hub's snapshot cache (downloaded where the Hub can be reached, read from the cache
where it cannot or HF_HUB_OFFLINE=1 says not to try), and the test of whether a name given
where a path is expected is meant as a Hub name; and a Hub dataset read from datasets' cache at
once where the Hub does not answer. huggingface_hub is imported only when a name is resolved, so
the planner may use this without torch or transformers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# owner/name, as the Hub spells repositories (a local path that exists always wins)
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_DATASET_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# what training needs of a model repository: its configs, tokenizer and chat template, then
# the transformers-named safetensors (not the .bin, .pth or original/ copies many keep)
CONFIG_FILES = ("config.json",)
MODEL_FILES_BUT_WEIGHTS = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")
MODEL_FILES = (*MODEL_FILES_BUT_WEIGHTS, "model*.safetensors")
# how long the Hub may take to answer whether it can be reached at all
PROBE_TIMEOUT_S = 5.0
# endings that name a local file, never a Hub name
_FILE_ENDINGS = (".json", ".jsonl", ".parquet", ".arrow", ".txt", ".safetensors", ".toml")


def is_model_id(name: str | Path) -> bool:
    """Whether `name` reads as a Hub model id (owner/name) and is no path here."""
    text = str(name)
    return (bool(_REPO_ID.fullmatch(text)) and not text.endswith(_FILE_ENDINGS)
            and not Path(text).expanduser().exists())


def dataset_name(spec: str | Path) -> tuple[str, str | None] | None:
    """(name, split or None) where `spec` reads as a Hub dataset name (`name`, `owner/name`,
    either with `:split`) and is no path here; None where it does not."""
    text = str(spec)
    name, colon, split = text.partition(":")
    if (not _DATASET_NAME.fullmatch(name) or name.endswith(_FILE_ENDINGS)
            or Path(text).expanduser().exists() or (colon and not split)):
        return None
    return name, split or None


def model_name(repo_id: str) -> str:
    """What a model from the Hub is called where a folder's name would be (its repo name)."""
    return repo_id.rsplit("/", 1)[-1]


def model_folder(repo_id: str, files: tuple[str, ...] = MODEL_FILES) -> Path:
    """The snapshot folder of a Hub model in huggingface_hub's cache, holding (at least) its
    `files` (patterns: CONFIG_FILES, MODEL_FILES_BUT_WEIGHTS or MODEL_FILES), downloaded if
    need be; a ValueError saying why and what to do where neither the Hub nor the cache has
    it."""
    from huggingface_hub import constants, errors, snapshot_download

    here = f"model {repo_id!r} is no preset or path here, and as a Hugging Face Hub id"
    tail = unreachable("the model", offline=constants.HF_HUB_OFFLINE)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(files)))
    except errors.GatedRepoError as err:
        msg = (f"{here} it is gated: accept its terms at https://huggingface.co/{repo_id} and "
               "log in (`hf auth login`), or pass the model's folder")
        raise ValueError(msg) from err
    except errors.RepositoryNotFoundError as err:
        msg = (f"{here} it is not on the Hub (or it is private: log in with `hf auth login`); "
               "check the id, or pass the model's folder")
        raise ValueError(msg) from err
    except errors.IncompleteSnapshotError as err:
        msg = (f"{here} its copy in the cache ({constants.HF_HUB_CACHE}) misses files and the "
               f"Hub cannot be reached to finish it ({err}); {tail.removeprefix('and ')}")
        raise ValueError(msg) from err
    except errors.LocalEntryNotFoundError as err:
        msg = f"{here} it is not in the cache ({constants.HF_HUB_CACHE}), {tail}"
        raise ValueError(msg) from err
    except OSError as err:  # the Hub's other HTTP errors, a download that failed
        msg = (f"{here} it could not be fetched ({type(err).__name__}: {err}); try again, or "
               "pass the model's folder")
        raise ValueError(msg) from err


def unreachable(what: str, *, offline: bool, switch: str = "HF_HUB_OFFLINE") -> str:
    """Why the Hub was not asked for `what` (offline mode, set by `switch`, or no network) and
    what to do: the tail of a message about a name the cache does not hold."""
    if offline:
        return (f"and {switch} is set, so the Hub is not asked: download {what} once with the "
                f"network on ({switch} unset), or pass a local path")
    return (f"and the Hub cannot be reached: connect to the network once to download {what}, "
            "or pass a local path")


def hub_answers() -> bool:
    """Whether the Hub answers one request, or may (a slow one, past PROBE_TIMEOUT_S, is
    left to the libraries' own waits); False where it cannot be reached at all."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 (the HTTP client's errors vary by version)
        return any("Timeout" in kind.__name__ for kind in type(err).__mro__)
    return True


@contextmanager
def cache_only_unless_the_hub_answers() -> Iterator[bool]:
    """Offline mode for the datasets calls within where the Hub does not answer (yields
    whether the user set it): datasets would retry for half a minute before reading its
    cache."""
    import datasets
    from huggingface_hub import constants

    asked = bool(datasets.config.HF_HUB_OFFLINE)
    if asked or hub_answers():
        yield asked
        return
    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield asked
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved
