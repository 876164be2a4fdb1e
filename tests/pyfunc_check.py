"""Load a logged MLflow model in a fresh process, in another directory, where the repository's packages can
only come from the model itself (its code paths): the editable install of Sieve is blocked here.

    python tests/pyfunc_check.py TRACKING_URI MODEL_URI TEXT...   → prints the predictions as JSON
"""

import importlib.abc
import json
import sys


class OnlyFromTheModel(importlib.abc.MetaPathFinder):
    """Refuse ``trainers`` / ``orchestrator`` from anywhere but an MLflow model's copied code."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in ("trainers", "orchestrator"):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                origin = spec.origin or str(list(spec.submodule_search_locations or []))
                if "/code/" not in origin:
                    raise ImportError(f"{name} from {origin}: not from the model's code paths")
                return spec
        return None


sys.meta_path.insert(0, OnlyFromTheModel())

import mlflow  # noqa: E402

mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
out = model.predict(sys.argv[3:])
print(json.dumps([list(map(float, r)) if hasattr(r, "__len__") else float(r) for r in out]))
