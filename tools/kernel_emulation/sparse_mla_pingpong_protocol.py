"""A model check of the ping-pong consumers' synchronisation in
src/kernels/cuda/sparse_mla/sparse_mla_prefill_fp8ring.cu
(fp8ring_pingpong_consumer and fp8ring_producer), written before the variant
first ran on a GPU.

The producer and the two consumer warpgroups are actors (a warpgroup moves as
one: its 128 arrivals are one unit, its own barriers are trivially met) that
run the kernel's sequence of waits, arrivals, reads and writes, one operation
at a time, in random interleavings. It checks:
- no deadlock (some actor can always move until all are done);
- no mbarrier phase overrun (a waiter's phase never two phases behind: on the
  GPU its parity would read as pending again);
- no named barrier with two arrivals of one party in a generation;
- every read sees the version it needs: ring slots hold the block a consumer
  reads, and the P^T tiles, flags and maxima the bunch that reads them
  (a write before the other consumer's read, or a read before the write, fails);
- the producer never overwrites a slot a consumer still reads.
It covers whether each consumer passes the running max (random per bunch, and
the first bunch of every item), items per CTA (persistent), bunches per item,
and the alternating score loops (MEGACTX_SPARSE_MLA_PINGPONG=2).

    python3 tools/kernel_emulation/sparse_mla_pingpong_protocol.py [RUNS]   # pure Python
"""
import random
import sys

SLOTS = 3


class Fail(Exception):
    pass


class MBarrier:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.phase = name, count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.phase = 0, self.phase + 1

    def ready(self, wanted):  # wanted: the absolute phase index whose completion is awaited
        if self.phase >= wanted + 2:
            raise Fail(f"{self.name}: phase {wanted} waited after phase {self.phase - 1} completed")
        return self.phase >= wanted + 1


class NamedBarrier:
    def __init__(self, name, parties):
        self.name, self.parties, self.arrived, self.generation = name, parties, set(), 0

    def arrive(self, who):
        if who in self.arrived:
            raise Fail(f"{self.name}: {who} arrived twice in one generation")
        self.arrived.add(who)
        if len(self.arrived) == self.parties:
            self.arrived, self.generation = set(), self.generation + 1
        return self.generation


def simulate(rng, items, bunches, alternate, mutation=None):
    full = [MBarrier(f"full[{s}]", 1) for s in range(SLOTS)]
    empty = [MBarrier(f"empty[{s}]", 2) for s in range(SLOTS)]
    vote = [MBarrier(f"vote[{c}]", 1) for c in range(2)]
    tile_bar = [MBarrier(f"tile[{c}]", 1) for c in range(2)]
    released = [MBarrier(f"released[{c}]", 1) for c in range(2)]
    query = NamedBarrier("query", 2)
    sums = NamedBarrier("sum", 2)
    turn = [NamedBarrier(f"turn[{c}]", 2) for c in range(2)]
    slot_block = [None] * SLOTS
    readers = [set() for _ in range(SLOTS)]
    tile = [None, None]  # the bunch whose P^T the tile holds
    flag = [None, None]  # (bunch, passed)
    maxima = [None, None]
    passes = [[rng.random() < 0.3 or b == 0 for b in range(items * bunches)] for _ in range(2)]

    def wait_mb(barrier, phase):
        while not barrier.ready(phase):
            yield
        yield

    def sync_nb(barrier, who):
        generation = barrier.generation
        barrier.arrive(who)
        while barrier.generation == generation:
            yield
        yield

    def producer():
        for k in range(items):
            for block in range(2 * bunches):
                ringed = k * 2 * bunches + block
                slot = ringed % SLOTS
                if ringed >= SLOTS:
                    yield from wait_mb(empty[slot], ringed // SLOTS - 1)
                if readers[slot]:
                    raise Fail(f"slot {slot} overwritten while {readers[slot]} read it")
                slot_block[slot] = ringed
                full[slot].arrive()
                yield

    def consumer(c):
        other = 1 - c
        if alternate and c == 1 and mutation != "no first turn":
            turn[0].arrive(c)
        for k in range(items):
            yield from sync_nb(query, c)
            for bunch in range(bunches):
                n = k * bunches + bunch
                own_block = k * 2 * bunches + 2 * bunch + c
                other_block = k * 2 * bunches + 2 * bunch + other
                own_slot, other_slot = own_block % SLOTS, other_block % SLOTS

                def read_slot(slot, block):
                    if slot_block[slot] != block:
                        raise Fail(f"consumer {c} read slot {slot} for block {block}, "
                                   f"it holds {slot_block[slot]}")
                    readers[slot].add(c)

                def still_holds(slot, block):
                    if slot_block[slot] != block:
                        raise Fail(f"slot {slot} overwritten while consumer {c} read block {block}")

                def end_read(slot):
                    readers[slot].discard(c)
                    empty[slot].arrive()

                def read(store, who, what):
                    value = store[who]
                    if value is None or value[0] != n:
                        raise Fail(f"consumer {c} read {what}[{who}] of bunch {n}, it holds {value}")
                    return value

                yield from wait_mb(full[own_slot], own_block // SLOTS)
                read_slot(own_slot, own_block)
                if alternate:
                    yield from sync_nb(turn[c], c)
                yield  # the score MMAs
                if alternate:
                    turn[other].arrive(c)
                passed = passes[c][n]
                if n > 0 and mutation != "no released wait":
                    yield from wait_mb(released[c], n - 1)

                def other_block_mmas():
                    yield from wait_mb(tile_bar[other], n)
                    yield from wait_mb(full[other_slot], other_block // SLOTS)
                    read_slot(other_slot, other_block)
                    read(tile, other, "tile")
                    yield  # the output MMAs
                    still_holds(other_slot, other_block)
                    read(tile, other, "tile")
                    end_read(other_slot)
                    released[other].arrive()
                    yield

                def own_block_mmas():
                    read(tile, c, "tile")
                    if mutation == "early release":
                        end_read(own_slot)
                    yield
                    still_holds(own_slot, own_block)
                    read(tile, c, "tile")
                    if mutation != "early release":
                        end_read(own_slot)
                    yield

                if not passed:
                    flag[c] = (n, False)
                    tile[c] = (n,)
                    tile_bar[c].arrive()
                    vote[c].arrive()
                    yield
                    yield from own_block_mmas()
                    yield from wait_mb(vote[other], n)
                    if read(flag, other, "flag")[1]:
                        read(maxima, other, "maxima")
                    yield from other_block_mmas()
                else:
                    maxima[c] = (n,)
                    flag[c] = (n, True)
                    vote[c].arrive()
                    yield from wait_mb(vote[other], n)
                    other_passed = read(flag, other, "flag")[1]
                    read(maxima, c, "maxima")
                    if other_passed:
                        read(maxima, other, "maxima")
                    tile[c] = (n,)
                    tile_bar[c].arrive()
                    yield
                    if not other_passed:
                        yield from other_block_mmas()
                    yield from own_block_mmas()
                    if other_passed:
                        yield from other_block_mmas()
            yield from sync_nb(sums, c)  # the epilogue's barriers
        if alternate and c == 0 and mutation != "no last turn":
            yield from sync_nb(turn[0], c)

    actors = {"producer": producer(), "consumer 0": consumer(0), "consumer 1": consumer(1)}
    # A waiting actor's generator re-checks its condition each time it is resumed.
    steps = 0
    while actors:
        name = rng.choice(sorted(actors))
        try:
            next(actors[name])
        except StopIteration:
            del actors[name]
        steps += 1
        if steps > 200000:
            raise Fail("no progress (deadlock) with " + ", ".join(sorted(actors)) + " left")
    for s in range(SLOTS):
        if readers[s]:
            raise Fail(f"slot {s} still read at exit")
    for barrier in turn:
        if barrier.arrived:
            raise Fail(f"{barrier.name}: an arrival pending at exit")


MUTATIONS = ("no released wait", "no first turn", "early release", "no last turn")


def run_all(runs, mutation=None):
    rng = random.Random(7)
    for run in range(runs):
        items, bunches = rng.randint(1, 3), rng.randint(1, 5)
        alternate = run % 2 == 1 or mutation in ("no first turn", "no last turn")
        try:
            simulate(rng, items, bunches, alternate, mutation)
        except Fail as failure:
            return f"run {run} (items {items}, bunches {bunches}, alternate {alternate}): {failure}"
    return None


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    # The check must see each of these broken protocols fail.
    for mutation in MUTATIONS:
        caught = run_all(runs, mutation)
        assert caught, f"the model check missed the mutation '{mutation}'"
        print(f"mutation '{mutation}' caught: {caught}")
    failure = run_all(runs)
    if failure:
        print(failure)
        sys.exit(1)
    print(f"{runs} interleavings: no deadlock, overrun or stale read")


if __name__ == "__main__":
    main()
