#!/usr/bin/env bash
# Usage: scripts/lm_eval_local.sh MODEL [lm_eval args...]   (MODEL: a saved linzoo folder or ORG/NAME; see evals/LM_EVAL.md)
# Tasks: $TASKS (default linzoo_arc_easy_local); data: $LINZOO_EVAL_DATA (folder of <task>.jsonl), else the shipped 50-doc sample.
exec lm_eval --model hf --model_args "pretrained=${1:?usage: $0 MODEL [lm_eval args...]},trust_remote_code=True,dtype=float32" --include_path "$(dirname "$0")/../evals/lm_eval_tasks" --tasks "${TASKS:-linzoo_arc_easy_local}" "${@:2}"
