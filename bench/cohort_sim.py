#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""cohort_sim -- an event simulation of secure async cohort placement.

Not fedbox: a model of it, to judge placement rules before measuring.
Workers train tasks of fixed durations (the throttles, +-5% jitter); a
cohort of B distinct workers is sealed when full, its setup takes SETUP;
a member that finishes training before its cohort's setup is done holds
its update until then (not free: its masks need every member's keys);
a cohort completes when every member's input is in and takes UNMASK
until its step; at most one cohort per worker is in flight. Policies:

  single  one cohort fills at a time (fedbox's rule before 2026-12-02)
  nearest the cohort filling nearest the worker's expected begin; a new
          one only when none is joinable, and while others fill only if
          the workers outside them can fill them all (open_safe)
  (each also with "last waits": the member whose input completes a
  cohort is free only at its step, fedbox's rule since 2026-12-06; before,
  it was free at once and trained from the model before the step)
  eager   as nearest, but a new one also when the nearest is farther than
          TOL x the worker's own task time (guarded against deadlock
          only: some cohort filling stays fillable)
  finish  no cohort at dispatch: a worker that has trained joins the
          cohort filling, in the order they finish; a full cohort's
          setup then runs after its last member trained (wait: the
          members idle meanwhile; pipelined: each trains its next task
          instead; last: as pipelined, but the member that filled the
          cohort starts its next task from the step's model)

and plain async (FedBuff), whose buffer takes updates as they arrive.

Prints steps per unit time, mean staleness (steps between a task's
dispatch and its cohort's step) and each worker's idle share (free, or
holding a trained update). Standard library only.

    bench/cohort_sim.py --throttles 1,1,2,4 --buffer 3
"""
import argparse
import random


def sim(durs, B, policy, T=3000.0, tol=0.5, seed=1, jitter=0.05,
        unmask=0.2, setup=0.1, last_waits=True):
    rnd = random.Random(seed)
    n = len(durs)
    est = [None] * n
    cohorts, ev, free = [], [], set(range(n))
    steps, stal = 0, []
    idle, idle_since = [0.0] * n, [0.0] * n

    def expect(w, now):
        e = est[w]
        if e is None:
            ks = [x for x in est if x is not None]
            e = sum(ks) / len(ks) if ks else None
        return None if e is None else now + e

    def cohort_expect(co, now):
        es = [max(m['expect'], now) for m in co['m'] if m['expect'] is not None]
        return max(es) if es else None

    def fillable(filling, target, strong):
        sizes = [len(x['m']) + (x is target) for x in filling]
        if target == 'new':
            sizes.append(1)
        still = [q for q in sizes if q < B]
        outside = n - sum(still)
        if not still:
            return True
        if strong:
            return sum(B - q for q in still) <= outside
        return min(B - q for q in still) <= outside

    def input_in(m, co, now, clean):
        w = m['w']
        m['in'] = now
        d = now - m['start']
        if est[w] is None or clean or d < est[w]:
            est[w] = d if est[w] is None else 0.5 * est[w] + 0.5 * d
        idle[w] += now - m['trained']
        idle_since[w] = now
        if all(x['in'] is not None for x in co['m']):
            co['state'] = 'done'
            co['last'] = w
            ev.append((now + unmask, 'step', co))
            if not last_waits:
                free.add(w)
        else:
            free.add(w)

    def dispatch(now):
        for w in sorted(free):
            filling = [co for co in cohorts if co['state'] == 'fill']
            f = expect(w, now)
            cand = [co for co in filling if all(m['w'] != w for m in co['m'])]
            can_open = len(cohorts) < n
            co = None
            if policy == 'single':
                if filling:
                    co = filling[0] if filling[0] in cand else None
                elif can_open:
                    co = 'new'
            else:
                best, bd = None, None
                if policy == 'eager':
                    cand = [c for c in cand if fillable(filling, c, False)]
                for c in cand:
                    e = cohort_expect(c, now)
                    d = 0 if e is None or f is None else abs(e - f)
                    if bd is None or d < bd - 1e-9 or (
                            abs(d - bd) < 1e-9 and len(c['m']) > len(best['m'])):
                        best, bd = c, d
                if policy == 'nearest':
                    if best is not None:
                        co = best
                    elif can_open and (not filling or fillable(filling, 'new', True)):
                        co = 'new'
                else:
                    can_open = can_open and fillable(filling, 'new', False)
                    own = 0 if f is None else f - now
                    if best is not None and (not can_open or bd <= tol * own):
                        co = best
                    elif can_open:
                        co = 'new'
                    else:
                        co = best
            if co is None:
                continue
            if co == 'new':
                co = {'m': [], 'state': 'fill', 'ready': None}
                cohorts.append(co)
            m = {'w': w, 'start': now, 'expect': f, 'in': None,
                 'trained': None, 'ver': steps}
            co['m'].append(m)
            free.discard(w)
            idle[w] += now - idle_since[w]
            ev.append((now + durs[w] * (1 + rnd.uniform(-jitter, jitter)),
                       'train', (m, co)))
            if len(co['m']) == B:
                co['state'] = 'run'
                co['ready'] = now + setup
                ev.append((now + setup, 'setup', co))

    t = 0.0
    dispatch(t)
    while t < T and ev:
        ev.sort(key=lambda e: e[0])
        t, kind, obj = ev.pop(0)
        if kind == 'step':
            stal.extend(steps - m['ver'] for m in obj['m'])
            steps += 1
            cohorts.remove(obj)
            if last_waits:
                free.add(obj['last'])
        elif kind == 'setup':
            for m in obj['m']:
                if m['trained'] is not None and m['in'] is None:
                    input_in(m, obj, t, False)
        else:
            m, co = obj
            m['trained'] = t
            if co['ready'] is not None and co['ready'] <= t:
                input_in(m, co, t, True)
        dispatch(t)
    return (steps / t, sum(stal) / max(len(stal), 1),
            [i / t for i in idle])


def sim_finish(durs, B, T=3000.0, seed=1, jitter=0.05, unmask=0.2,
               setup=0.1, mode='wait'):
    """Cohorts bound at finish: the first B trained form one. mode wait:
    the members idle until the setup is done; pipelined: each trains its
    next task while its update waits in a cohort; last: as pipelined,
    but the member that fills the cohort starts its next task from the
    step's model (it waits for the setup and the unmask)."""
    rnd = random.Random(seed)
    n = len(durs)
    ev, steps, stal, filling = [], 0, [], []
    idle = [0.0] * n

    def task(w, now):
        ev.append((now + durs[w] * (1 + rnd.uniform(-jitter, jitter)),
                   'train', (w, steps)))

    for w in range(n):
        task(w, 0.0)
    t = 0.0
    while t < T and ev:
        ev.sort(key=lambda e: e[0])
        t, kind, obj = ev.pop(0)
        if kind == 'train':
            filling.append((obj, t))
            full = len(filling) == B
            if mode == 'pipelined' or (mode == 'last' and not full):
                task(obj[0], t)
            if full:
                ev.append((t + setup, 'setup', filling))
                filling = []
        elif kind == 'setup':
            for (w, ver), done in obj:
                if mode == 'wait':
                    idle[w] += t - done
                    task(w, t)
            ev.append((t + unmask, 'step', obj))
        else:
            stal.extend(steps - v for (_, v), _ in obj)
            steps += 1
            if mode == 'last':
                (w, _), done = obj[-1]
                idle[w] += t - done
                task(w, t)
    return (steps / t, sum(stal) / max(len(stal), 1),
            [i / t for i in idle])


def sim_plain(durs, B, T=3000.0, seed=1, jitter=0.05):
    """Plain FedBuff: each buffer of B arrivals is one step at once."""
    rnd = random.Random(seed)
    ev = [(d * (1 + rnd.uniform(-jitter, jitter)), w, 0)
          for w, d in enumerate(durs)]
    steps, stal, buf, t = 0, [], [], 0.0
    while t < T:
        ev.sort()
        t, w, ver = ev.pop(0)
        buf.append(ver)
        if len(buf) == B:
            stal.extend(steps - v for v in buf)
            steps += 1
            buf = []
        ev.append((t + durs[w] * (1 + rnd.uniform(-jitter, jitter)), w,
                   steps))
    return steps / t, sum(stal) / max(len(stal), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--throttles", default="1,1,2,4")
    ap.add_argument("--buffer", type=int, default=3)
    ap.add_argument("--tol", type=float, default=0.5)
    ap.add_argument("--unmask", type=float, default=0.2)
    ap.add_argument("--seeds", default="1,2,3")
    a = ap.parse_args()
    durs = [float(x) for x in a.throttles.split(",")]
    print("plain async (FedBuff) would step %.3f times a unit" %
          (sum(1 / d for d in durs) / a.buffer))
    for sd in a.seeds.split(","):
        r = sim_plain(durs, a.buffer, seed=int(sd))
        print("plain  seed %s: %.3f steps/unit, staleness %.2f" % (
            sd, r[0], r[1]))
    for pol in ("single", "nearest", "eager"):
        for s in a.seeds.split(","):
            for lw in (False, True):
                r = sim(durs, a.buffer, pol, tol=a.tol, seed=int(s),
                        unmask=a.unmask, last_waits=lw)
                print("%-6s seed %s%s: %.3f steps/unit, staleness %.2f, "
                      "idle %s" % (pol, s, ", last waits" if lw else "",
                                   r[0], r[1],
                                   " ".join("%.2f" % i for i in r[2])))
    for s in a.seeds.split(","):
        for mode in ('wait', 'pipelined', 'last'):
            for setup in (0.1, 0.02):
                r = sim_finish(durs, a.buffer, seed=int(s), unmask=a.unmask,
                               setup=setup, mode=mode)
                print("finish, %s, seed %s, setup %.2f: %.3f steps/unit, "
                      "staleness %.2f, idle %s" % (
                          mode, s, setup, r[0], r[1],
                          " ".join("%.2f" % i for i in r[2])))


if __name__ == "__main__":
    main()
