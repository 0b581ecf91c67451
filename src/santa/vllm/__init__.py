"""santa inside vLLM (issue 27, in progress): the configuration read from the environment (:mod:`santa.vllm.config`)."""
