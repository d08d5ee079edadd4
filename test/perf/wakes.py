#!/usr/bin/env python3
"""What the latency tools' threads did and what woke them, from
`perf script -F comm,pid,tid,cpu,time,event,trace,ip,sym` of a system-wide
record of sched:sched_switch, sched:sched_wakeup (with call chains) and a
uprobe on rdmaperf's main.slowRoundTrip (test/perf/switches.sh -W).

Usage: wakes.py TOOL_COMM < perf-script-output

Prints the tool's threads' switches (how many were preemptions: the thread
still runnable), what woke them (the waker's command and its user frames,
or where it has none or the wake came from an interrupt, the kernel's below
the wake-up itself) and where the thread was asleep (its user frames when
it blocked), and, for the round trips that rdmaperf marked slow
(one way >= 1 ms), where the CPUs' time went during them: for the tool's
threads, per side (client or server) and what the thread was running when
it was switched out (its first frame of ours), and per other command.
"""
import collections
import re
import sys

HEAD = re.compile(r'^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)$')
# Kernel frames of the wake-up machinery itself: not who woke.
WAKE_FRAMES = re.compile(r'^(try_to_wake_up|ttwu|wake_up|__wake_up|autoremove_wake|default_wake|'
                         r'pollwake|__schedule|schedule|__traceiter|perf_|__perf|trace_|'
                         r'ep_poll_callback|wake_q|__x64_sys|do_syscall|entry_SYSCALL|'
                         r'futex_wake|do_futex)')
IRQ_FRAMES = re.compile(r'irq|softirq|sysvec|apic_timer|hrtimer|napi|net_rx')
# Our frames, to name a thread by.
OURS = re.compile(r'^(main\.|github\.com/go-rdma/|runtime\.(sysmon|mstart|stoplockedm|findRunnable|'
                  r'stopm|notesleep|netpoll|usleep))')


def events(f):
    ev = None
    for line in f:
        line = line.rstrip('\n')
        m = HEAD.match(line)
        if m:
            if ev:
                yield ev
            comm, pid, tid, cpu, t, name, trace = m.groups()
            ev = dict(comm=comm.strip(), pid=int(pid), tid=int(tid), cpu=int(cpu), t=float(t),
                      name=name, trace=trace, kern=[], user=[])
            continue
        parts = line.split()
        if ev and len(parts) >= 2 and re.match(r'^[0-9a-f]+$', parts[0]):
            (ev['kern'] if parts[0].startswith('ffffffff') else ev['user']).append(parts[1])
            continue
    if ev:
        yield ev


def field(trace, key):
    m = re.search(r'\b' + key + r'=(\S+)', trace)
    return m.group(1) if m else ''


def waker_chain(ev):
    kern = [k for k in ev['kern'] if not WAKE_FRAMES.match(k)]
    if ev['user'] and not any(IRQ_FRAMES.search(k) for k in ev['kern']):
        return ' < '.join(ev['user'][:6])
    return ' < '.join(kern[:4]) or '(no frames)'


def main():
    tool = sys.argv[1][:15]
    evs = list(events(sys.stdin))
    tgid = {}  # the tool's threads: tid -> pid
    for e in evs:
        if e['comm'] == tool:
            tgid[e['tid']] = e['pid']
    client = {e['pid'] for e in evs if e['name'].endswith(':slowrt')}
    switches = pre = wakeups = 0
    preempted = collections.Counter()
    woken = collections.Counter()
    asleep = {}  # tid -> where it last blocked (our frames)
    for e in evs:
        if e['name'] == 'sched:sched_switch' and e['comm'] == tool:
            switches += 1
            if field(e['trace'], 'prev_state').startswith('R'):
                pre += 1
                preempted[' < '.join(e['user'][:4]) or '(kernel)'] += 1
            else:
                asleep[e['tid']] = ' < '.join(e['user'][:4]) or '(kernel)'
        elif e['name'] == 'sched:sched_wakeup' and field(e['trace'], 'comm') == tool:
            wakeups += 1
            who = 'self' if e['comm'] == tool else e['comm']
            wakee = int(field(e['trace'], 'pid') or 0)
            woken[who + ': ' + waker_chain(e) + '\n          asleep in ' + asleep.get(wakee, '?')] += 1
    print(f'    switches {switches}, of them preempted {pre}; wakeups {wakeups}')
    print('    preempted at:')
    for k, n in preempted.most_common(5):
        print(f'      {n} {k}')
    print('    woken by:')
    for k, n in woken.most_common(10):
        print(f'      {n} {k}')

    def ours(chain):
        return next((u for u in chain if OURS.match(u)), chain[0] if chain else '(kernel)')

    def label(e):
        """What the thread e switches out ran: its side and its frame of ours."""
        tid = e['tid']
        if tid == 0:
            return 'idle'
        if tid in tgid:
            side = 'client' if tgid[tid] in client else 'server'
            return f'{side}: {ours(e["user"])}'
        return re.sub(r'[/:]\d+$', '', e['comm'])

    # Who held each CPU when: intervals between switches.
    runs = []  # (start, end, label)
    last = {}  # cpu -> when the task now on it was switched in
    for e in evs:
        if e['name'] != 'sched:sched_switch':
            continue
        c, t = e['cpu'], e['t']
        if c in last:
            runs.append((last[c], t, label(e)))
        last[c] = t
    slow = [(e['t'], int(field(e['trace'], 'd') or 0) * 2 / 1e9) for e in evs if e['name'].endswith(':slowrt')]
    if not slow:
        print('    no round trip of 2 ms or more')
        return
    total = collections.Counter()
    per = []
    for end, dur in slow:
        start = end - dur
        c = collections.Counter()
        for a, b, lab in runs:
            if b > start and a < end:
                c[lab] += min(b, end) - max(a, start)
        total.update(c)
        per.append((dur, end, c))
    span = sum(d for d, _, _ in per)
    ncpu = len({e['cpu'] for e in evs})
    print(f'    {len(slow)} round trips of 2 ms or more, {span * 1e3:.1f} ms in all; '
          f'the {ncpu} CPUs\' time during them:')
    for lab, s in total.most_common(8):
        print(f'      {s / span / ncpu * 100:5.1f}% {lab}')
    for dur, end, c in sorted(per, reverse=True)[:3]:
        top = ', '.join(f'{lab} {s * 1e3:.1f}' for lab, s in c.most_common(5))
        print(f'    one of {dur * 1e3:.1f} ms (ms of CPU): {top}')


main()
