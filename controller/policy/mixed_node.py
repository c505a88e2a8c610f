"""PD-mixed-node pools: a node hosts one prefill and one decode instance on the same GPUs (issue 8).

The unit of scaling is the node. Every policy sizes the two roles as usual, from the pool's partitioned
per-instance capacities (``controller.capacity.pool_capacity``: the prefill instance at its memory share, the
decode instance at the rest, its ITL budget cut by the interference of the node's busy prefill), and the
node count is the larger of the two needs: ``nodes = max(prefill, decode)``. The role that asks for more binds;
the other role's instances on the extra nodes are spare capacity. A mixed node has no standby tier (a warm node
would hold both instances' memory), as in the local pools (``serving.pools.manager``).
"""

from __future__ import annotations

from dataclasses import replace

from controller.policy.types import ScalingPlan


def binding_role(prefill: int, decode: int) -> str:
    """The role whose need sets the node count ("prefill" on ties: it is the node's first instance)."""
    return "prefill" if prefill >= decode else "decode"


def node_plan(plan: ScalingPlan, min_nodes: int = 0, max_nodes: int | None = None) -> ScalingPlan:
    """``plan`` as whole mixed nodes: both roles at ``max(prefill, decode)`` (within ``[min_nodes,
    max_nodes]``), no standby, and a reason that says which role binds."""
    wanted = max(plan.prefill, plan.decode)
    nodes = max(wanted, min_nodes)
    if max_nodes is not None:
        nodes = min(nodes, max_nodes)
    role = binding_role(plan.prefill, plan.decode)
    other = "decode" if role == "prefill" else "prefill"
    why = (
        f"mixed-node pool: {nodes} nodes (one prefill + one decode instance each) = max(prefill "
        f"{plan.prefill}, decode {plan.decode}): {role} binds"
    )
    if plan.prefill != plan.decode:
        why += f", {abs(plan.prefill - plan.decode)} {other} instance(s) spare"
    if nodes != wanted:
        why += f"; clamped to [{min_nodes}, {max_nodes}]"
    if plan.standby_prefill or plan.standby_decode:
        why += f"; standby {plan.standby_prefill}+{plan.standby_decode} dropped (mixed nodes have no standby tier)"
    return replace(
        plan,
        prefill=nodes,
        decode=nodes,
        standby_prefill=0,
        standby_decode=0,
        reasons=(*plan.reasons, why),
    )
