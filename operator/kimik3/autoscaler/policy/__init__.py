"""Decode-latency policy: how many groups keep the per-token latency under target.

One part per concern, each with its own state and tests (tests/test_policy_*.py):

- interface.py: ``FleetState`` in, ``Decision`` out, the ``Policy`` protocol;
- model.py: ``GroupLatencyModel``, the latency ``n`` groups give at a demand (shared Poisson
  batches, Little's law), learned online;
- demand.py: the demand now from one observation, the panic path on a saturated fleet;
- forecast.py: ``DemandForecast``, that demand a lead time ahead (fit.py: the least squares),
  level shifts, its measured shortfall;
- loading.py: ``GroupArrivals``, groups coming and the load time;
- reaction.py: where the observed quantile overrules the model (over target, anchored scale-down);
- bursts.py: ``BurstHold``, the groups kept between bursts shorter than a load time;
- stabilization.py: ``Stabilization``, the windows, the bounds, no traffic;
- latency.py: ``LatencyPolicy``, the order of a decision; settings.py: its ``LatencyPolicySettings``.
"""

from kimik3.autoscaler.policy.interface import Decision, FleetState, Policy
from kimik3.autoscaler.policy.latency import LatencyPolicy
from kimik3.autoscaler.policy.model import GroupLatencyModel
from kimik3.autoscaler.policy.settings import LatencyPolicySettings

__all__ = ["Decision", "FleetState", "GroupLatencyModel", "LatencyPolicy", "LatencyPolicySettings", "Policy"]
