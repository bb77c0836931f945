"""A Python-backend embedding model for the tests: a BYTES text input, an FP32 vector and an INT32 count per input.

Tokens are whitespace-separated words. The vector is [words, characters, 0.5, -0.25] (exact in float32,
so tests can compare). An input longer than the `context_tokens` parameter is refused with INVALID_ARG
(HTTP 400), as a real model refuses a prompt longer than its context window.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.context = int(config["parameters"]["context_tokens"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            vectors, counts, refused = [], [], None
            for i, raw in enumerate(texts):
                text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
                words = len(text.split())
                if words > self.context:
                    refused = f"input {i} has {words} tokens, more than the model's context of {self.context}"
                vectors.append([words, len(text), 0.5, -0.25])
                counts.append([words])
            if refused:
                error = pb_utils.TritonError(refused, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("embedding", np.array(vectors, dtype=np.float32)),
                        pb_utils.Tensor("prompt_tokens", np.array(counts, dtype=np.int32)),
                    ]
                )
            )
        return responses
