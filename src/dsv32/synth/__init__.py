"""Data synthesis (§3.1, §3.2.3): agentic tasks, pass@k filtering, cold-start and distillation data."""
