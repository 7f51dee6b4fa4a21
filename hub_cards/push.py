"""`linzoo push`: check one checkpoint folder and upload it with its generated model card.

    linzoo push runs/my-student --repo-id my-org/my-student-base --dry-run   # the plan, no network
    linzoo push runs/my-student --repo-id my-org/my-student-base             # after `hf auth login`
    linzoo push runs/my-student-sft --repo-id my-org/my-student-instruct \
        --base-model my-org/my-student-base --create-pr

Uploaded: the folder's top-level files and eval/, with README.md replaced by the regenerated card; other
subfolders (stage checkpoints) stay home. Nothing is sent unless every check of `plan.py` passes.
"""

from __future__ import annotations

from pathlib import Path

from linzoo.arguments import ArgumentParser

from .plan import (ReleaseError, add_existing_repo_flags, check_repo_id, hub_error, hub_token, plan_checkpoint,
                   repo_exists, upload)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="linzoo push", description="Upload one checkpoint folder to the Hub.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--repo-id", required=True, help="ORG/NAME of the model repo")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    parser.add_argument("--base-model", help="Hub id of the parent (default: the recorded teacher / parent)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and run the checks; send nothing")
    add_existing_repo_flags(parser)
    return push(parser.parse_args(argv))  # a ReleaseError reaches the CLI: one line, exit 2


def push(args) -> int:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    check_repo_id(args.repo_id)  # cheap refusals first: an id the Hub refuses, no token, or a repo we may not touch
    api = exists = None
    if not args.dry_run:
        api = HfApi(token=hub_token())
        exists = repo_exists(api, args.repo_id, "model", args.overwrite, args.create_pr)
    plan = plan_checkpoint(args.folder, args.repo_id, args.private, args.revision, args.base_model)
    print(("DRY RUN, nothing is sent\n" if args.dry_run else "") + plan.describe(args.overwrite, args.create_pr))
    if not plan.ok:
        raise ReleaseError("a check failed; nothing was uploaded.")
    if args.dry_run:
        return 0
    try:
        url = upload(api, plan, exists, args.create_pr)
    except HfHubHTTPError as err:
        raise hub_error(err, f"uploading to {args.repo_id}") from None
    print(f"linzoo: uploaded {args.folder} -> {url}")
    return 0
