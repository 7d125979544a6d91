"""The LPJob operator against the stand-in API server: time from creating an LPJob to all its pods created.

    python bench/k8s_operator.py [--reps 5] [--out bench/results/k8s_operator.json]

For 1, 16 and 128 replicas: the operator (kopf, in this process's thread, as
``KopfRunner`` runs it) creates the headless service and one pod per replica
with the ``kubernetes`` client, one POST each. Reference, same run: the same
manifests created by a plain loop of the same client calls (no operator), so
the ratio shows what kopf's event handling adds. The stand-in server answers
in microseconds; on a real API server every POST costs a round trip and
admission (typically 5-20 ms), which then bounds both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import plots  # bench/plots.py, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "k8s_operator.json"))
    args = parser.parse_args()

    import kubernetes
    from kopf.testing import KopfRunner

    from tlaunch.jobs import JobSpec
    from tlaunch.k8s.children import children
    from tlaunch.k8s.crd import crd
    from tlaunch.testing.kube import StandInAPIServer

    results: dict[str, Any] = {
        "what": "LPJob created -> all pods created, stand-in API server, medians",
        "reps": args.reps,
    }
    with StandInAPIServer() as api:
        os.environ["KUBECONFIG"] = api.kubeconfig
        kubernetes.config.load_kube_config(api.kubeconfig)
        kubernetes.client.ApiextensionsV1Api().create_custom_resource_definition(crd())
        custom, core = kubernetes.client.CustomObjectsApi(), kubernetes.client.CoreV1Api()
        with KopfRunner(["run", "--standalone", "--all-namespaces", "-m", "tlaunch.k8s.operator"]):
            time.sleep(2)
            for n in (1, 16, 128):
                op, plain = [], []
                for rep in range(args.reps):
                    name = f"j{n}-{rep}"
                    lpjob = JobSpec(lpjob_name=name, script=["t.py"], image="img", num_trainer=n).to_lpjob()
                    t0 = time.perf_counter()
                    custom.create_namespaced_custom_object(
                        "tlaunch.io", "v1alpha1", "default", "lpjobs", lpjob
                    )
                    while api.count("", "pods", "default", f"tlaunch.io/job={name}") < n:
                        time.sleep(0.005)
                    op.append(time.perf_counter() - t0)
                    custom.delete_namespaced_custom_object(
                        "tlaunch.io", "v1alpha1", "default", "lpjobs", name
                    )

                    made = children(
                        {**lpjob, "metadata": {**lpjob["metadata"], "name": f"p{name}", "uid": "u"}}
                    )
                    t0 = time.perf_counter()
                    for m in made:
                        if m["kind"] == "Service":
                            core.create_namespaced_service("default", m)
                        else:
                            core.create_namespaced_pod("default", m)
                    plain.append(time.perf_counter() - t0)
                    for m in made:
                        api.delete(
                            "",
                            "services" if m["kind"] == "Service" else "pods",
                            "default",
                            m["metadata"]["name"],
                        )
                results[str(n)] = {
                    "operator_s": statistics.median(op),
                    "plain_client_s": statistics.median(plain),
                    "ratio": statistics.median(op) / statistics.median(plain),
                    "raw": {"operator": op, "plain": plain},
                }
                print(n, {k: round(v, 4) for k, v in results[str(n)].items() if k != "raw"})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    plots.plot_file(args.out, "k8s_operator")
    return 0


if __name__ == "__main__":
    sys.exit(main())
