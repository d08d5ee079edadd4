#!/usr/bin/env python3
"""Where a Go benchmark's slow waits went, from its execution trace and the
kernel's record of its threads (test/perf/gowaits.sh).

Usage: gowaits.py PARSED_TRACE PERF_SCRIPT [SLOW_US]

PARSED_TRACE is `go tool trace -d=parsed` of the benchmark's trace;
PERF_SCRIPT `perf script -F comm,tid,cpu,time,event,trace,ip,sym --ns` of a
system-wide record (clock CLOCK_MONOTONIC, the trace's clock) of
sched:sched_switch and sched:sched_wakeup with call chains.

The waiter is the goroutine that blocked in rdma.(*Future).Wait most often.
For each of its waits (blocked -> readied -> running) it prints the
percentiles of the whole wait and of the readied-to-running delay, who
readied it, and for the slow ones (SLOW_US, 15 µs, or more) which of three
things the delay was: the waiter readied late (the completion or its
handling came late), or readied on time and left waiting for a CPU while
the goroutine that readied it went on running (the poller, on the same P,
until its next yield), or moved to another P. Then, from the kernel's
record, every switch-out of the benchmark's threads by state (R: preempted
while runnable; S: asleep) and user call chain, and the wake-ups those
threads issued, by call chain, with how many fell inside a slow wait.
"""
import collections
import re
import sys

EV = re.compile(r'^M=(-?\d+) P=(-?\d+) G=(-?\d+) (\w+) Time=(\d+)(.*)$')
GST = re.compile(r' GoID=(\d+) (\w+)->(\w+)(?: Reason="(.*)")?')
PERF = re.compile(r'^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+(\S+):\s+(.*)$')


def trace_events(path):
    """The goroutine state transitions, with the first frames of their stacks."""
    evs, cur = [], None
    for line in open(path, errors='replace'):
        if line.startswith('M='):
            cur = None
            m = EV.match(line.rstrip('\n'))
            if not m or m.group(4) != 'StateTransition':
                continue
            g = GST.match(m.group(6))
            if not g:
                continue
            cur = dict(M=int(m.group(1)), P=int(m.group(2)), G=int(m.group(3)), t=int(m.group(5)),
                       go=int(g.group(1)), fr=g.group(2), to=g.group(3), reason=g.group(4) or '', stack=[])
            evs.append(cur)
        elif cur is not None and line.startswith('\t') and not line.startswith('\t\t'):
            cur['stack'].append(line.strip().split(' @')[0])
    return evs


def name_of(stack):
    """A goroutine's name: the outermost frame of its own code."""
    for f in reversed(stack):
        if not f.startswith(('runtime.', 'sync.', 'internal/', 'testing.')):
            return f.split('/')[-1]
    return stack[-1].split('/')[-1] if stack else '?'


def pct(a, q):
    return a[min(len(a) - 1, int(q * len(a)))] if a else 0


def main():
    evs = trace_events(sys.argv[1])
    slow_ns = int(float(sys.argv[3]) * 1000) if len(sys.argv) > 3 else 15000
    blocks = collections.Counter(e['go'] for e in evs
                                 if e['fr'] == 'Running' and e['to'] == 'Waiting'
                                 and any('(*Future).Wait' in f for f in e['stack']))
    if not blocks:
        sys.exit('gowaits.py: no goroutine blocked in rdma.(*Future).Wait')
    waiter = blocks.most_common(1)[0][0]
    names = {}
    for e in evs:
        if e['G'] == e['go'] and len(e['stack']) > len(names.get(e['go'], ())):
            names[e['go']] = e['stack']
    names = {g: name_of(st) for g, st in names.items()}
    waits, cur = [], None
    for i, e in enumerate(evs):
        if e['go'] != waiter:
            continue
        if e['fr'] == 'Running' and e['to'] == 'Waiting':
            cur = dict(t0=e['t'])
        elif e['fr'] == 'Waiting' and e['to'] == 'Runnable' and cur:
            cur.update(t1=e['t'], by=e['G'], byP=e['P'], byM=e['M'], i1=i)
        elif e['fr'] == 'Runnable' and e['to'] == 'Running' and cur and 't1' in cur:
            cur.update(t2=e['t'], P=e['P'])
            waits.append(cur)
            cur = None
    whole = sorted(w['t2'] - w['t0'] for w in waits)
    delay = sorted(w['t2'] - w['t1'] for w in waits)
    print('waiter: goroutine %d, %d waits' % (waiter, len(waits)))
    print('  whole wait        p50 %6.1f  p90 %6.1f  p99 %6.1f  p99.9 %6.1f us' % tuple(pct(whole, q) / 1e3 for q in (.5, .9, .99, .999)))
    print('  readied->running  p50 %6.1f  p90 %6.1f  p99 %6.1f  p99.9 %6.1f us' % tuple(pct(delay, q) / 1e3 for q in (.5, .9, .99, .999)))
    by = collections.Counter(names.get(w['by'], w['by']) for w in waits)
    print('  readied by: ' + ', '.join('%s %d' % kv for kv in by.most_common(4)))
    slow = [w for w in waits if w['t2'] - w['t0'] >= slow_ns]
    kinds = collections.Counter()
    for w in slow:
        if w['t1'] - w['t0'] >= slow_ns // 2:
            k = 'readied late'
        elif w['P'] != w['byP']:
            k = 'readied on time, ran on another P'
        else:
            k = 'readied on time, ran on the P that readied it'
        w['kind'] = k
        kinds[k] += 1
    span = (waits[-1]['t2'] - waits[0]['t0']) / 1e9 if waits else 1
    print('slow waits (>= %.0f us): %d (%.2f %%), %.0f per second of the loop (%.3f s)' % (
        slow_ns / 1e3, len(slow), 100.0 * len(slow) / max(1, len(waits)), len(slow) / span, span))
    for k, n in kinds.most_common():
        ws = [w for w in slow if w['kind'] == k]
        print('  %-48s %5d  readied->running median %.1f us' % (k, n, sorted(w['t2'] - w['t1'] for w in ws)[len(ws) // 2] / 1e3))

    # The kernel's side.
    tids = set()
    for e in evs:
        if e['M'] > 0:
            tids.add(e['M'])
    windows = sorted((w['t1'], w['t2']) for w in slow)
    import bisect
    starts = [a for a, _ in windows]

    def in_slow(t):
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= windows[i][1]

    readier = collections.defaultdict(list)  # tid -> slow waits it readied on its own P
    for w in slow:
        if w['kind'].endswith('the P that readied it'):
            readier[w['byM']].append(w)
    fate = {}
    switches, wakes = collections.Counter(), collections.Counter()
    wakes_slow = collections.Counter()
    blocks = open(sys.argv[2], errors='replace').read().split('\n\n')
    for b in blocks:
        lines = b.strip('\n').split('\n')
        m = PERF.match(lines[0]) if lines else None
        if not m or int(m.group(2)) not in tids:
            continue
        t = int(m.group(4)) * 10**9 + int(m.group(5).ljust(9, '0')[:9])
        frames = [ln.split()[1] for ln in lines[1:] if len(ln.split()) > 1]
        user = [f for f in frames if '.' in f and not f.startswith(('__', 'do_', 'x64_', 'entry_', 'syscall_'))][:4]
        chain = ' < '.join(f.split('/')[-1] for f in user) or '(kernel)'
        if m.group(6) == 'sched:sched_switch':
            st = re.search(r'prev_state=(\S+)', m.group(7))
            if st and re.search(r'prev_pid=%s ' % m.group(2), m.group(7)):
                switches[(st.group(1)[:1], chain)] += 1
                for w in readier.get(int(m.group(2)), ()):
                    if w['t1'] <= t <= w['t2'] and id(w) not in fate:
                        fate[id(w)] = '%s %s' % (st.group(1)[:1], ' < '.join(chain.split(' < ')[:3]))
        elif m.group(6) == 'sched:sched_wakeup':
            wakes[chain] += 1
            if in_slow(t):
                wakes_slow[chain] += 1
    if readier:
        n = sum(len(v) for v in readier.values())
        c = collections.Counter(fate.get(id(w), 'not switched out') for v in readier.values() for w in v)
        print('the readying thread in the %d slow waits that ran on its P (its first switch-out meanwhile):' % n)
        for k, v in c.most_common(5):
            print('  %5d %s' % (v, k))
    print('switch-outs of the benchmark\'s threads (state: R preempted, S asleep), by user call chain:')
    for (st, chain), n in switches.most_common(8):
        print('  %6d %s %s' % (n, st, chain))
    print('wake-ups they issued, by call chain (all / within a slow wait\'s readied->running):')
    for chain, n in wakes.most_common(6):
        print('  %6d %5d %s' % (n, wakes_slow[chain], chain))


if __name__ == '__main__':
    main()
