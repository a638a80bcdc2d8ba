"""The exchanges: `all_to_all_single` of uint8 rows with split sizes, each on the process group of its hop, and a
record of every call -- the split lists it sent and received, its off-rank bytes per link class, its time.

Hops (DeepEP's normal kernels): "world" (flat EP: every rank); "ib", the cross-node hop between the ranks with the
same local index, one per node (RDMA between NICs of the same rail); "nvlink", the in-node hop among the ranks of
one node. `hop_groups` makes the two subgroups for a worker (`dist.new_subgroups_by_enumeration`, as picotron's
process-group manager does), so an all-to-all pays only the latency of its own group: with one rank per node the
"nvlink" group is the rank alone.
"""
from __future__ import annotations

import time

import torch

def hop_lists(world_size: int, ranks_per_node: int) -> dict:
    """The ranks of every group of each hop: "ib" [[l, l+G, l+2G, ...] for each local index l] (G ranks per node),
    "nvlink" [the ranks of each node]."""
    per_node, nodes = ranks_per_node, world_size // ranks_per_node
    return {"ib": [[n * per_node + lo for n in range(nodes)] for lo in range(per_node)],
            "nvlink": [[n * per_node + j for j in range(per_node)] for n in range(nodes)]}


def hop_groups(rank: int, world_size: int, ranks_per_node: int) -> dict:
    """{hop: (process group, global ranks in it)} for this rank, "world" included (a collective call: every rank
    must make it, in the same order; the caller keeps the groups for as long as it exchanges)."""
    import torch.distributed as dist
    mine = {}
    for hop, lists in hop_lists(world_size, ranks_per_node).items():
        group, _ = dist.new_subgroups_by_enumeration(lists)
        mine[hop] = (group, next(r for r in lists if rank in r))
    return {"world": (None, list(range(world_size))), **mine}


class Exchange:
    """all_to_all_single of rows on each hop's group; every call appended to `calls` as {"name", "hop", "peers",
    "send_counts", "recv_counts" (the split lists as exchanged, by peer in the group), "sent", "recv" (off-rank
    bytes), "ib", "nvlink" (payload bytes sent to another node / inside the node), "meta", "seconds"}.
    barrier=True waits for the group before each call, so the time is the exchange's own, not a wait for a peer
    still busy with local work (packing, encoding)."""

    def __init__(self, rank: int, world_size: int, ranks_per_node: int, device, groups: dict,
                 barrier: bool = False):
        self.rank, self.world, self.per_node, self.device = rank, world_size, ranks_per_node, device
        self.groups = groups
        self.barrier = barrier
        self.calls: list = []

    def same_node(self, other: int) -> bool:
        return other // self.per_node == self.rank // self.per_node

    def sent_by_rank(self, name: str) -> list:
        """The split list call `name` sent, as a list over every rank of the world (0 where it sent nothing)."""
        call = next(c for c in self.calls if c["name"] == name)
        out = [0] * self.world
        for peer, n in zip(call["peers"], call["send_counts"]):
            out[peer] = n
        return out

    def _all_to_all(self, out, inp, hop, recv=None, send=None) -> float:
        import torch.distributed as dist

        from common.parallel.ranks import synchronize
        group = self.groups[hop][0]
        synchronize()
        if self.barrier:
            dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=group)
        synchronize()
        return time.perf_counter() - t0

    def counts(self, send_counts: list, hop: str = "world") -> list:
        """Exchange row counts on `hop` (one per peer of its group): what each peer will send me."""
        peers = self.groups[hop][1]
        send = torch.tensor(send_counts, dtype=torch.int64, device=self.device)
        recv = torch.empty_like(send)
        seconds = self._all_to_all(recv, send, hop)
        nbytes = 8 * (len(peers) - 1)
        self.calls.append({"name": "counts", "hop": hop, "peers": peers, "send_counts": [1] * len(peers),
                           "recv_counts": [1] * len(peers), "sent": nbytes, "recv": nbytes, "ib": 0, "nvlink": 0,
                           "meta": nbytes, "seconds": seconds})
        return recv.tolist()

    def rows(self, name: str, rows: torch.Tensor, send_counts: list, recv_counts: list, payload_bytes: int,
             hop: str = "world") -> torch.Tensor:
        """Send `rows` [sum(send_counts), W] uint8 grouped by destination (the peers of `hop`'s group, in order);
        return the received rows, grouped by source."""
        peers = self.groups[hop][1]
        width = rows.shape[1]
        out = torch.empty(sum(recv_counts), width, dtype=torch.uint8, device=self.device)
        seconds = self._all_to_all(out, rows.contiguous(), hop, list(recv_counts), list(send_counts))
        rec = {"name": name, "hop": hop, "peers": peers, "send_counts": list(send_counts),
               "recv_counts": list(recv_counts), "sent": 0, "recv": 0, "ib": 0, "nvlink": 0, "meta": 0,
               "seconds": seconds}
        for peer, ns, nr in zip(peers, send_counts, recv_counts):
            if peer == self.rank:
                continue
            rec["sent"] += ns * width
            rec["recv"] += nr * width
            rec["nvlink" if self.same_node(peer) else "ib"] += ns * payload_bytes
            rec["meta"] += ns * (width - payload_bytes)
        self.calls.append(rec)
        return out
