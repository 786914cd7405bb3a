"""Evaluation: DSA perplexity and attention recall (:mod:`~dsv32.eval.dsa`) and their reports
(:mod:`~dsv32.eval.report`)."""

from dsv32.eval.dsa import EvalPoint, evaluate_dsa
from dsv32.eval.report import markdown_report, report_dict, write_report

__all__ = ["EvalPoint", "evaluate_dsa", "markdown_report", "report_dict", "write_report"]
