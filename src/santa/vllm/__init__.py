"""santa inside vLLM 0.26 (issue 27; run in vLLM 0.26.0 on the H200: benchmarks/RESULTS.md, "Standing: inside vLLM").

- :mod:`santa.vllm.config`: santa's settings from ``SANTA_VLLM_*`` variables (no vLLM import).
- :mod:`santa.vllm.decode`: the decode step on vLLM's paged FlashAttention cache (no vLLM import).
- :mod:`santa.vllm.layers`: which attention layers santa serves (no vLLM import).
- :mod:`santa.vllm.backend`: the ``CUSTOM`` attention backend (imports vLLM).
- :mod:`santa.vllm.plugin`: the ``vllm.general_plugins`` entry point that registers it.
"""
