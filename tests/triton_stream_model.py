"""The one decoupled Python-backend model behind the streaming test models (each model.py links here).

Like tests/triton_echo_model.py it echoes the prompt's words, at most max_tokens of them, but one word
per response, `token_delay_ms` apart (config parameter), the way a decoupled LLM (TensorRT-LLM's
ensemble with stream=true) answers /generate_stream. Every response carries the counts so far under the
INT32 output names the config declares (none: a model without authoritative usage). `fail_after` makes
it send an error response after that many words. A request the client abandoned is logged to the
server's log ("stream cancelled after N tokens") and stops, so tests can see the upstream was closed.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _parameter(config, name, default):
    value = config.get("parameters", {}).get(name, {}).get("string_value", "")
    return int(value) if value else default


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        counts = [o["name"] for o in config.get("output", []) if o["data_type"] == "TYPE_INT32"]
        self.prompt_count, self.completion_count = (counts + ["", ""])[:2]
        self.delay = _parameter(config, "token_delay_ms", 50) / 1000
        self.fail_after = _parameter(config, "fail_after", -1)

    def _response(self, text, prompt_tokens, completion_tokens):
        tensors = [pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_))]
        if self.prompt_count:
            tensors.append(pb_utils.Tensor(self.prompt_count, np.array([[prompt_tokens]], dtype=np.int32)))
        if self.completion_count:
            tensors.append(pb_utils.Tensor(self.completion_count, np.array([[completion_tokens]], dtype=np.int32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            limit = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            words = prompt.split()
            reply = words[: max(limit, 0)]
            for index, word in enumerate(reply):
                if request.is_cancelled():
                    pb_utils.Logger.log_info(f"stream cancelled after {index} tokens")
                    break
                if index == self.fail_after:
                    error = pb_utils.TritonError(f"model failed on purpose after {index} tokens")
                    sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error))
                    break
                text = word if index == 0 else " " + word
                sender.send(self._response(text, len(words), index + 1))
                time.sleep(self.delay)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
