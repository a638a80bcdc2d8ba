"""Ring all-reduces a learner might write for exercise 7.3: the right one, and the wrong ones its checker must name
(tests/test_exercises_lab07.py). Each is a plain function (the checker sends its source to real ranks)."""
import torch


def right(x, rank, world_size, dist):
    p = world_size
    chunks = torch.tensor_split(x.view(-1), p)
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        send, recv_i = chunks[(rank - step) % p], (rank - step - 1) % p
        buf = torch.empty_like(chunks[recv_i])
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, buf, prv)]):
            w.wait()
        chunks[recv_i].add_(buf)
    for step in range(p - 1):
        send, recv = chunks[(rank + 1 - step) % p], chunks[(rank - step) % p]
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]):
            w.wait()
    return x


def reverse_ring(x, rank, world_size, dist):
    """Right too: every rank sends to rank - 1 and receives from rank + 1."""
    p = world_size
    chunks = torch.tensor_split(x.view(-1), p)
    nxt, prv = (rank - 1) % p, (rank + 1) % p
    for step in range(p - 1):
        send, recv_i = chunks[(rank + step) % p], (rank + step + 1) % p
        buf = torch.empty_like(chunks[recv_i])
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, buf, prv)]):
            w.wait()
        chunks[recv_i].add_(buf)
    for step in range(p - 1):
        send, recv = chunks[(rank - 1 + step) % p], chunks[(rank + step) % p]
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]):
            w.wait()
    return x


def calls_all_reduce(x, rank, world_size, dist):
    dist.all_reduce(x)
    return x


def send_then_receive(x, rank, world_size, dist):
    """Unbatched: isend waited for before the irecv is posted (fine on gloo, a deadlock under NCCL)."""
    p = world_size
    chunks = torch.tensor_split(x.view(-1), p)
    for step in range(p - 1):
        recv_i = (rank - step - 1) % p
        buf = torch.empty_like(chunks[recv_i])
        dist.isend(chunks[(rank - step) % p], (rank + 1) % p).wait()
        dist.irecv(buf, (rank - 1) % p).wait()
        chunks[recv_i].add_(buf)
    for step in range(p - 1):
        dist.send(chunks[(rank + 1 - step) % p], (rank + 1) % p)
        dist.recv(chunks[(rank - step) % p], (rank - 1) % p)
    return x


def _exchange(dist, send, recv, to, frm):
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]):
        w.wait()


def _ring(x, rank, world_size, dist, phases=(0, 1), chunk=lambda r, k, p: (r - k) % p, add=True, add_in_gather=False,
          steps=None, split=torch.tensor_split, frm=lambda r, p: (r - 1) % p):
    """A ring with one known mistake (the keywords): which phases run, which chunk a reduce-scatter step sends,
    whether a step adds or overwrites, how many steps, how x is cut, which rank a step receives from."""
    p = world_size
    chunks = split(x.view(-1), p)
    for phase in phases:
        for step in range(p - 1 if steps is None else steps(p)):
            if phase == 0:
                send, recv_i = chunks[chunk(rank, step, p)], (rank - step - 1) % p
            else:
                send, recv_i = chunks[(rank + 1 - step) % p], (rank - step) % p
            summing = add if phase == 0 else add_in_gather
            buf = torch.empty_like(chunks[recv_i]) if summing else chunks[recv_i]
            _exchange(dist, send, buf, (rank + 1) % p, frm(rank, p))
            if summing:
                chunks[recv_i].add_(buf)
    return x


def _variant(**mistake):
    def ring_all_reduce(x, rank, world_size, dist):
        return _ring(x, rank, world_size, dist, **mistake)
    return ring_all_reduce


wrong_neighbour = _variant(frm=lambda r, p: (r + 1) % p)  # receives from rank + 1, which sends to rank + 2
reduce_scatter_only = _variant(phases=(0,))
all_gather_only = _variant(phases=(1,))
wrong_chunk = _variant(chunk=lambda r, k, p: (r + k) % p)  # the all-gather's index in the reduce-scatter
overwrites = _variant(add=False)  # receives into the chunk: the partial sums are lost
adds_in_all_gather = _variant(add_in_gather=True)
p_steps = _variant(steps=lambda p: p)  # p steps per phase instead of p - 1
torch_chunk = _variant(split=torch.chunk)  # fewer than p chunks for some sizes


def averages(x, rank, world_size, dist):
    right(x, rank, world_size, dist)
    return x.div_(world_size)


def not_in_place(x, rank, world_size, dist):
    return right(x.clone(), rank, world_size, dist)


def whole_tensor(x, rank, world_size, dist):
    """Passes the whole tensor around the ring, adding as it goes (right sums, p times the bytes)."""
    p = world_size
    acc, cur = x.clone(), x.clone()
    for _ in range(p - 1):
        buf = torch.empty_like(cur)
        _exchange(dist, cur, buf, (rank + 1) % p, (rank - 1) % p)
        acc += buf
        cur = buf
    x.copy_(acc)
    for _ in range(p - 1):
        _exchange(dist, x.clone(), torch.empty_like(x), (rank + 1) % p, (rank - 1) % p)
    return x


def returns_none(x, rank, world_size, dist):
    right(x, rank, world_size, dist)


def torch_dist(x, rank, world_size, dist):
    """Uses torch.distributed from the notebook instead of the `dist` it is given."""
    import torch.distributed as real
    real.barrier()
    return x


def uses_the_reference(x, rank, world_size, dist):
    from common.parallel import collectives
    return collectives.ring_all_reduce(x, rank, world_size, dist)


def uses_a_notebook_name(x, rank, world_size, dist):
    """Right on threads; on real ranks a name of the notebook is missing."""
    return right(x, rank, world_size, dist)


def blocking_by_parity(x, rank, world_size, dist):
    """Right too, without batches: blocking send and recv, even ranks send first and odd ranks receive first (so no
    two neighbours both wait to send; with an odd p, the last rank's send waits one step more)."""
    p = world_size
    chunks = torch.tensor_split(x.view(-1), p)
    nxt, prv = (rank + 1) % p, (rank - 1) % p

    def exchange(send, recv):
        if rank % 2 == 0:
            dist.send(send, nxt)
            dist.recv(recv, prv)
        else:
            dist.recv(recv, prv)
            dist.send(send, nxt)
    for step in range(p - 1):
        recv_i = (rank - step - 1) % p
        buf = torch.empty_like(chunks[recv_i])
        exchange(chunks[(rank - step) % p].clone(), buf)
        chunks[recv_i].add_(buf)
    for step in range(p - 1):
        exchange(chunks[(rank + 1 - step) % p].clone(), chunks[(rank - step) % p])
    return x
