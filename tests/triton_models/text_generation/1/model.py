"""Test model for SpeedInfer's Triton adapter: echoes the prompt's words, at most max_tokens of them.

Token counts are whitespace-separated words. Generated from the same template for every test model.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

PROMPT_COUNT = "prompt_tokens"
COMPLETION_COUNT = "completion_tokens"
FAIL_MARKER = ""


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            prompts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            limits = pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)
            texts, prompt_counts, completion_counts = [], [], []
            failed = None
            for raw, limit in zip(prompts, limits, strict=True):
                prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
                if FAIL_MARKER and FAIL_MARKER in prompt:
                    failed = "model failed on purpose: " + FAIL_MARKER
                words = prompt.split()
                reply = words[: max(int(limit), 0)]
                texts.append([" ".join(reply).encode("utf-8")])
                prompt_counts.append([len(words)])
                completion_counts.append([len(reply)])
            if failed:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(failed)))
                continue
            tensors = [pb_utils.Tensor("text_output", np.array(texts, dtype=np.object_))]
            if PROMPT_COUNT:
                tensors.append(pb_utils.Tensor(PROMPT_COUNT, np.array(prompt_counts, dtype=np.int32)))
            if COMPLETION_COUNT:
                tensors.append(pb_utils.Tensor(COMPLETION_COUNT, np.array(completion_counts, dtype=np.int32)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
