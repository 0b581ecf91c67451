"""Per-layer sample budgets (the paper's Appendix I–K).

- :mod:`santa.budgets.schedule`: the search's schedules (uniform, one-hot, a policy's, rounded); their
  ``{layer: S}`` form and their JSON file are :mod:`santa.schedule_file`'s.
- :mod:`santa.budgets.reinforce`: the REINFORCE policy math of Algorithm 1 (no Ray).
- :mod:`santa.budgets.scorers`, :mod:`santa.budgets.rewards`: scoring a schedule on a model (KL vs
  dense, or a task graded by :mod:`santa.eval.grading`) and the episode reward built on it.
- :mod:`santa.budgets.ablate`: the one-hot layer ablation (Fig. 8); :mod:`santa.budgets.sweep`
  runs schedule cells resumably and pairs them with a baseline.
- :mod:`santa.budgets.run_folder`, :mod:`santa.budgets.distributed`: the tuning history and the
  Ray driver and workers (``santa tune budgets``).

Nothing here is imported by the rest of santa; Ray and transformers are imported only where needed.
"""
