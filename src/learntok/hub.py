"""Sharing models on the Hugging Face Hub (optional extra: pip install 'learntok[hub]').

    learntok.hub.push_to_hub("runs/wiki", "user/learntok-wiki")     # a run, checkpoint or exported directory
    model = learntok.from_pretrained("user/learntok-wiki")          # downloaded once into the Hub's cache

`push_to_hub` exports the model (config.json, model.safetensors, the strategy's files) with a generated model card
(learntok.card: config, training data, validation BPB, boundary statistics, a boundary map) and uploads the folder
in one commit. Reading a Hub id is learntok.pretrained's (`download`: the Hub's cache, tokens and environment
variables apply; with HF_HUB_OFFLINE=1 it reads the cache only and never touches the network).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from learntok.card import write_model_card
from learntok.errors import LearntokError
from learntok.pretrained import TOKENIZER_SETTINGS, hub_package, load, save_pretrained
from learntok.version import __version__


def push_to_hub(source, repo_id: str, *, private: bool = False, token: str | None = None,
                commit_message: str | None = None, revision: str | None = None) -> str:
    """Upload a model to the Hub as `repo_id` (created if needed); returns the commit's URL. `source` is a ByteLM
    with a `seq_len` attribute, or anything `learntok.pretrained.load` reads (run, checkpoint, exported directory
    or Hub id). The uploaded folder always has a model card. `revision`: the branch to push to, created from
    main if it does not exist (default: main)."""
    hub = hub_package()
    with tempfile.TemporaryDirectory(prefix="learntok-push-") as tmp:
        if isinstance(source, (str, Path)):
            loaded = load(source)
            model, seq_len, run_dir = loaded.model, loaded.seq_len, loaded.run_dir or loaded.path
        else:
            model, seq_len, run_dir = source, int(getattr(source, "seq_len", 512)), None
        save_pretrained(model, tmp, seq_len=seq_len, source_dir=run_dir, card=False)
        write_model_card(Path(tmp), model, seq_len, run_dir, repo_id=repo_id)
        api = hub.HfApi(token=token, library_name="learntok", library_version=__version__)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            if revision is not None:  # a new branch starts from main (upload_folder refuses a missing one)
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            info = api.upload_folder(folder_path=tmp, repo_id=repo_id, repo_type="model", revision=revision,
                                     commit_message=commit_message or f"Upload learntok model ({__version__})",
                                     delete_patterns=strategy_file_patterns())
        except Exception as e:  # no token, no network, no permission
            raise LearntokError(f"push to {repo_id} failed: {str(e).strip().splitlines()[0]}") from e
    return str(getattr(info, "commit_url", info))


def strategy_file_patterns() -> list[str]:
    """The files a learntok model may or may not have (every strategy's artifacts, a tokenizer's settings), as
    patterns: a push deletes those its upload does not carry, so a model replaced on the Hub never loads another's
    tokenizer or calibration table. Other files in the repository are left alone."""
    from learntok.boundaries import available, boundary_config, build_strategy

    names = {TOKENIZER_SETTINGS}
    for name in available():
        try:
            names.update(build_strategy(boundary_config(name), 64).artifacts())
        except ImportError:  # a strategy whose optional dependency is missing has no files here either
            continue
    return sorted(x for n in names for x in (n, f"{n}/*"))
