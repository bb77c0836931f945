"""The one Python-backend model behind every test model in tests/triton_models (each model.py links here).

It echoes the prompt's words, at most max_tokens of them; token counts are whitespace-separated words.
What differs between the test models is their config.pbtxt, which this reads: the INT32 outputs the
config declares are the prompt and completion counts under whatever names it gives them (none: a
model without authoritative usage), and a `fail_marker` parameter makes it fail on prompts holding it.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        counts = [o["name"] for o in config.get("output", []) if o["data_type"] == "TYPE_INT32"]
        self.prompt_count, self.completion_count = (counts + ["", ""])[:2]
        marker = config.get("parameters", {}).get("fail_marker", {})
        self.fail_marker = marker.get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            prompts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            limits = pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)
            texts, prompt_counts, completion_counts = [], [], []
            failed = None
            for raw, limit in zip(prompts, limits, strict=True):
                prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
                if self.fail_marker and self.fail_marker in prompt:
                    failed = "model failed on purpose: " + self.fail_marker
                words = prompt.split()
                reply = words[: max(int(limit), 0)]
                texts.append([" ".join(reply).encode("utf-8")])
                prompt_counts.append([len(words)])
                completion_counts.append([len(reply)])
            if failed:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(failed)))
                continue
            tensors = [pb_utils.Tensor("text_output", np.array(texts, dtype=np.object_))]
            if self.prompt_count:
                tensors.append(pb_utils.Tensor(self.prompt_count, np.array(prompt_counts, dtype=np.int32)))
            if self.completion_count:
                tensors.append(pb_utils.Tensor(self.completion_count, np.array(completion_counts, dtype=np.int32)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
