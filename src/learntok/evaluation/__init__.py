"""Evaluation the paper's way (paper Appendix D, docs/method.md): held-out bits per byte, downstream tasks from
local files, boundary statistics, inference FLOPs, and the tables of `learntok compare`.

    bpb.py       scoring: held-out BPB, continuation log-likelihoods, greedy decoding; boundary modes
    tasks.py     PIQA / HellaSwag / ARC-Easy / LAMBADA readers and metrics
    stats.py     means with standard errors; boundary rate, -log pi, bytes per token, agreement with references
    report.py    one evaluation -> eval.json and a readable table
    compare.py   runs side by side (Tables 1 and 3) as Markdown and CSV
    commands.py  `learntok eval` and `learntok compare`
    harness.py   an lm-evaluation-harness model ("learntok"); needs the `eval` extra, imported only on demand
"""

from learntok.evaluation.bpb import BoundaryMode, PairScore, greedy_decode, heldout_bpb, score_pairs
from learntok.evaluation.report import EvalConfig, evaluate_model, format_report, read_eval, write_eval
from learntok.evaluation.stats import BoundaryStats, mean_se, ratio_se
from learntok.evaluation.tasks import TASKS, read_task, score_task

__all__ = ["TASKS", "BoundaryMode", "BoundaryStats", "EvalConfig", "PairScore", "evaluate_model", "format_report",
           "greedy_decode", "heldout_bpb", "mean_se", "ratio_se", "read_eval", "read_task", "score_pairs",
           "score_task", "write_eval"]
