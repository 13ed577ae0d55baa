"""The example model from the README, release r1: OUTPUT0 = INPUT0 * 2.

`make run` serves examples/store as the model store. Deploy r1, then r2, and watch the
answer to the same request go from [2, 4] to [3, 6] without a failed request (`make run`
prints the port; 8000 unless it was taken):

    curl -s -X POST http://127.0.0.1:8000/v2/models/example/infer \\
      -d '{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1,2]}]}'

It runs on Triton's Python backend, on CPU, so it needs no GPU. To publish a release of your
own, write its files, then SHA256SUMS last (`sha256sum` format, paths relative to the release
directory): the daemon treats a release without it as not yet published.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

FACTOR = np.float32(2)  # r1 doubles, r2 triples: easy to tell apart in a curl answer


class TritonPythonModel:
    def execute(self, requests):
        # Triton may hand several requests at once; answer each in order.
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = pb_utils.Tensor("OUTPUT0", (x * FACTOR).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
