use super::*;
use crate::core::Time;
use std::sync::Arc;

fn ms(v: i64) -> Dur {
    Dur::from_ms(v)
}

fn at(v: i64) -> Time {
    Time::ZERO + Dur::from_ms(v)
}

/// det --fanout--> cls: a detector whose items each go to a classifier.
fn det_cls() -> Arc<Graph> {
    Arc::new(
        Graph::new(
            vec![Step::new("det", "ssd"), Step::new("cls", "resnet")],
            &[EdgeSpec::fanout("det", "cls")],
            &["det", "cls"],
        )
        .unwrap(),
    )
}

fn budgets(g: &Graph, b: &[i64], slo: i64) -> Budgets {
    Budgets::new(g, b.iter().map(|&v| ms(v)).collect(), ms(slo)).unwrap()
}

#[test]
fn fanout_many_makes_one_task_per_item_and_outputs_in_item_order() {
    let g = det_cls();
    let b = budgets(&g, &[10, 10], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    assert_eq!(roots.len(), 1);
    let det = roots[0].key;
    let p = run.done(det, at(5), &[(0, 3)]).unwrap();
    assert!(p.end.is_none());
    assert_eq!(p.tasks.len(), 3);
    for (i, t) in p.tasks.iter().enumerate() {
        assert_eq!(t.step, 1);
        assert_eq!(t.items, vec![i as u32]);
        assert_eq!(
            t.inputs,
            vec![Input {
                edge: 0,
                task: det,
                item: Some(i as u32)
            }]
        );
    }
    // Items finish out of order; the output is still in item order.
    let keys: Vec<TaskKey> = p.tasks.iter().map(|t| t.key).collect();
    assert!(run.done(keys[2], at(8), &[]).unwrap().end.is_none());
    assert!(run.done(keys[0], at(9), &[]).unwrap().end.is_none());
    let last = run.done(keys[1], at(12), &[]).unwrap();
    let end = last.end.expect("the request ends with its last task");
    assert_eq!(end.outcome, Outcome::Good);
    assert_eq!(end.outputs, Some(vec![vec![det], keys.clone()]));
    assert!(run.ended());
    // A second report on a finished task is refused, not a second end.
    assert_eq!(
        run.done(keys[1], at(13), &[]),
        Err(AppError::NotOutstanding(keys[1]))
    );
}

#[test]
fn fanout_zero_runs_nothing_below_and_ends_with_an_empty_output() {
    // det --fanout--> cls --whole--> post: zero items, so neither cls nor post runs.
    let g = Arc::new(
        Graph::new(
            vec![
                Step::new("det", "ssd"),
                Step::new("cls", "resnet"),
                Step::new("post", "post"),
            ],
            &[
                EdgeSpec::fanout("det", "cls"),
                EdgeSpec::whole("cls", "post"),
            ],
            &["post"],
        )
        .unwrap(),
    );
    let b = budgets(&g, &[10, 10, 5], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::SlackForwarding, at(0));
    let p = run.done(roots[0].key, at(4), &[(0, 0)]).unwrap();
    assert!(p.tasks.is_empty());
    let end = p.end.expect("nothing left to run");
    assert_eq!(end.outcome, Outcome::Good);
    assert_eq!(end.outputs, Some(vec![vec![]]));
}

#[test]
fn fanout_one_makes_one_task() {
    let g = det_cls();
    let b = budgets(&g, &[10, 10], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let p = run.done(roots[0].key, at(4), &[(0, 1)]).unwrap();
    assert_eq!(p.tasks.len(), 1);
    assert_eq!(p.tasks[0].items, vec![0]);
    let end = run.done(p.tasks[0].key, at(40), &[]).unwrap().end.unwrap();
    // The last task finished after arrival + SLO.
    assert_eq!(end.outcome, Outcome::Late);
    assert!(end.outcome.is_late());
    assert_eq!(
        end.outputs,
        Some(vec![vec![roots[0].key], vec![p.tasks[0].key]])
    );
}

#[test]
fn done_needs_exactly_the_fanout_counts_of_its_step() {
    let g = det_cls();
    let b = budgets(&g, &[10, 10], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let k = roots[0].key;
    assert_eq!(
        run.done(k, at(1), &[]),
        Err(AppError::Fanout { task: k, edge: 0 })
    );
    assert_eq!(
        run.done(k, at(1), &[(0, 1), (0, 2)]),
        Err(AppError::Fanout { task: k, edge: 0 })
    );
    assert_eq!(
        run.done(k, at(1), &[(7, 1)]),
        Err(AppError::Fanout { task: k, edge: 7 })
    );
    // The refused reports changed nothing.
    assert_eq!(run.outstanding(), 1);
    assert_eq!(run.done(k, at(1), &[(0, 2)]).unwrap().tasks.len(), 2);
    assert_eq!(
        run.done(TaskKey(99), at(1), &[]),
        Err(AppError::UnknownTask(TaskKey(99)))
    );
}

/// a → {b, c} → d (a diamond, no fan-out), budgets a 10, b 10, c 30, d 10.
fn diamond() -> Arc<Graph> {
    Arc::new(
        Graph::new(
            vec![
                Step::new("a", "m1"),
                Step::new("b", "m2"),
                Step::new("c", "m3"),
                Step::new("d", "m4"),
            ],
            &[
                EdgeSpec::whole("a", "b"),
                EdgeSpec::whole("a", "c"),
                EdgeSpec::whole("b", "d"),
                EdgeSpec::whole("c", "d"),
            ],
            &["d"],
        )
        .unwrap(),
    )
}

#[test]
fn a_join_waits_for_all_its_parents() {
    let g = diamond();
    let b = budgets(&g, &[10, 10, 30, 10], 50);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let a = roots[0].key;
    let p = run.done(a, at(5), &[]).unwrap();
    let (tb, tc) = (p.tasks[0].clone(), p.tasks[1].clone());
    assert_eq!((tb.step, tc.step), (1, 2));
    assert!(run.done(tb.key, at(10), &[]).unwrap().tasks.is_empty());
    let p = run.done(tc.key, at(30), &[]).unwrap();
    assert_eq!(p.tasks.len(), 1);
    let d = &p.tasks[0];
    assert_eq!(d.step, 3);
    let from: Vec<TaskKey> = d.inputs.iter().map(|i| i.task).collect();
    assert_eq!(from, vec![tb.key, tc.key]);
    let end = run.done(d.key, at(45), &[]).unwrap().end.unwrap();
    assert_eq!(end.outcome, Outcome::Good);
    assert_eq!(end.outputs, Some(vec![vec![d.key]]));
}

#[test]
fn a_join_inside_a_fanout_runs_once_per_item() {
    // det --fanout--> crop; crop → {emb, age} → merge, all per item.
    let g = Arc::new(
        Graph::new(
            vec![
                Step::new("det", "ssd"),
                Step::new("crop", "crop"),
                Step::new("emb", "emb"),
                Step::new("age", "age"),
                Step::new("merge", "merge"),
            ],
            &[
                EdgeSpec::fanout("det", "crop"),
                EdgeSpec::whole("crop", "emb"),
                EdgeSpec::whole("crop", "age"),
                EdgeSpec::whole("emb", "merge"),
                EdgeSpec::whole("age", "merge"),
            ],
            &["merge"],
        )
        .unwrap(),
    );
    let b = budgets(&g, &[5, 5, 5, 5, 5], 40);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::SlackForwarding, at(0));
    let crops = run.done(roots[0].key, at(1), &[(0, 2)]).unwrap().tasks;
    let mut pending: Vec<TaskSpec> = Vec::new();
    for c in &crops {
        pending.extend(run.done(c.key, at(2), &[]).unwrap().tasks);
    }
    assert_eq!(pending.len(), 4);
    let mut merges = Vec::new();
    let mut end = None;
    // Finish item 1's branches first, then item 0's.
    pending.sort_by_key(|t| std::cmp::Reverse(t.items.clone()));
    for t in &pending {
        let p = run.done(t.key, at(3), &[]).unwrap();
        merges.extend(p.tasks);
    }
    assert_eq!(merges.len(), 2);
    assert_eq!(merges[0].items, vec![1]);
    for m in &merges {
        let p = run.done(m.key, at(4), &[]).unwrap();
        end = end.or(p.end);
    }
    let end = end.unwrap();
    // Outputs in item order, whatever the finishing order.
    assert_eq!(end.outputs, Some(vec![vec![merges[1].key, merges[0].key]]));
}

#[test]
fn a_failed_task_ends_the_request_once_and_later_reports_are_discarded() {
    let g = det_cls();
    let b = budgets(&g, &[10, 10], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let items = run.done(roots[0].key, at(3), &[(0, 3)]).unwrap().tasks;
    let p = run.failed(items[1].key, "backend lost").unwrap();
    let end = p.end.expect("a failure ends the request");
    assert_eq!(
        end.outcome,
        Outcome::Failed {
            task: Some(items[1].key),
            step: Some(1),
            reason: "backend lost".into()
        }
    );
    assert_eq!(end.outputs, None);
    assert_eq!(end.cancelled, vec![items[0].key, items[2].key]);
    assert_eq!(run.outstanding(), 0);
    // The other tasks' later reports end nothing: each is to be discarded, once.
    for p in [
        run.done(items[0].key, at(9), &[]).unwrap(),
        run.expired(items[2].key).unwrap(),
    ] {
        assert!(p.discard);
        assert!(p.end.is_none() && p.tasks.is_empty());
    }
    assert_eq!(
        run.done(items[0].key, at(9), &[]),
        Err(AppError::NotOutstanding(items[0].key))
    );
    assert_eq!(run.abort("client left"), None);
}

#[test]
fn an_expired_task_ends_the_request_late_once() {
    let g = diamond();
    let b = budgets(&g, &[10, 10, 30, 10], 50);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let p = run.done(roots[0].key, at(5), &[]).unwrap();
    let end = run.expired(p.tasks[0].key).unwrap().end.unwrap();
    assert_eq!(
        end.outcome,
        Outcome::Expired {
            task: p.tasks[0].key,
            step: 1
        }
    );
    assert!(end.outcome.is_late());
    assert_eq!(end.cancelled, vec![p.tasks[1].key]);
    // The sibling's completion spawns no join and ends nothing.
    let q = run.done(p.tasks[1].key, at(20), &[]).unwrap();
    assert!(q.discard && q.tasks.is_empty() && q.end.is_none());
}

#[test]
fn static_deadlines_are_cumulative_budgets_along_the_longest_path() {
    let g = diamond();
    let b = budgets(&g, &[10, 10, 30, 10], 50);
    let (run, _) = AppRun::start(&g, &b, DeadlineRule::Static, at(100));
    let d: Vec<Time> = (0..4).map(|s| run.step_deadline(s)).collect();
    assert_eq!(d, vec![at(110), at(120), at(140), at(150)]);
    assert_eq!(run.deadline(), at(150));
}

#[test]
fn slack_forwarding_gives_a_step_the_time_its_branch_does_not_need() {
    let g = diamond();
    let b = budgets(&g, &[10, 10, 30, 10], 50);
    let (run, _) = AppRun::start(&g, &b, DeadlineRule::SlackForwarding, at(100));
    let d: Vec<Time> = (0..4).map(|s| run.step_deadline(s)).collect();
    // a: 50 - (30 + 10); b: 50 - 10 (static gives 20); c: 50 - 10; d: the SLO.
    assert_eq!(d, vec![at(110), at(140), at(140), at(150)]);
}

#[test]
fn slack_forwarding_passes_unused_time_to_the_successor() {
    // a → b with budgets 10 + 10 under a 40 ms SLO. `a` finishes at 3 ms: under
    // static budgets `b` must still finish by 20 ms, under slack forwarding by the
    // application's deadline, 40 ms.
    let g = Arc::new(
        Graph::new(
            vec![Step::new("a", "m1"), Step::new("b", "m2")],
            &[EdgeSpec::whole("a", "b")],
            &["b"],
        )
        .unwrap(),
    );
    let b = budgets(&g, &[10, 10], 40);
    let mut child = Vec::new();
    for rule in [DeadlineRule::Static, DeadlineRule::SlackForwarding] {
        let (mut run, roots) = AppRun::start(&g, &b, rule, at(0));
        let p = run.done(roots[0].key, at(3), &[]).unwrap();
        child.push(p.tasks[0].deadline);
    }
    assert_eq!(child, vec![at(20), at(40)]);
    assert!(child[1] > child[0]);
}

/// a → b → c, budgets 20 + 20 + 20 under a 60 ms SLO, least latencies 5, 4, 3.
fn chain_latest() -> (Arc<Graph>, Budgets) {
    let g = Arc::new(
        Graph::new(
            vec![
                Step::new("a", "m1"),
                Step::new("b", "m2"),
                Step::new("c", "m3"),
            ],
            &[EdgeSpec::whole("a", "b"), EdgeSpec::whole("b", "c")],
            &["c"],
        )
        .unwrap(),
    );
    let b = budgets(&g, &[20, 20, 20], 60)
        .with_least(&g, vec![ms(5), ms(4), ms(3)])
        .unwrap();
    (g, b)
}

#[test]
fn latest_useful_deadlines_leave_the_steps_after_a_task_only_their_least_latency() {
    let (g, b) = chain_latest();
    let (run, roots) = AppRun::start(&g, &b, DeadlineRule::LatestUseful, at(100));
    // Ordered and batched as under slack forwarding.
    let d: Vec<Time> = (0..3).map(|s| run.step_deadline(s)).collect();
    assert_eq!(d, vec![at(120), at(140), at(160)]);
    // Last deadlines: 60 - (4 + 3), 60 - 3, 60.
    let l: Vec<Time> = (0..3).map(|s| run.step_latest(s)).collect();
    assert_eq!(l, vec![at(153), at(157), at(160)]);
    assert_eq!((roots[0].deadline, roots[0].latest), (at(120), at(153)));
    // The other rules have one deadline.
    for rule in [DeadlineRule::Static, DeadlineRule::SlackForwarding] {
        let (run, _) = AppRun::start(&g, &b, rule, at(100));
        assert!((0..3).all(|s| run.step_latest(s) == run.step_deadline(s)));
    }
    // A least latency above the budgets never makes the last deadline earlier.
    let tight = budgets(&g, &[20, 20, 20], 60)
        .with_least(&g, vec![ms(30), ms(30), ms(30)])
        .unwrap();
    let (run, _) = AppRun::start(&g, &tight, DeadlineRule::LatestUseful, at(0));
    assert!((0..3).all(|s| run.step_latest(s) == run.step_deadline(s)));
    assert_eq!(
        budgets(&g, &[20, 20, 20], 60).with_least(&g, vec![ms(1)]),
        Err(BudgetError::Count {
            steps: 3,
            budgets: 1
        })
    );
    assert_eq!(
        budgets(&g, &[20, 20, 20], 60).with_least(&g, vec![ms(1), ms(-1), ms(1)]),
        Err(BudgetError::Negative("b".into()))
    );
}

#[test]
fn a_task_dropped_at_its_planned_deadline_is_served_by_its_last_one_and_the_request_ends_good() {
    let (g, b) = chain_latest();
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::LatestUseful, at(0));
    // `a` misses its planned 20 ms: it comes back with its last deadline, 53 ms.
    let p = run.expired(roots[0].key).unwrap();
    assert!(p.end.is_none() && !p.discard);
    assert_eq!(p.tasks.len(), 1);
    assert_eq!(
        (p.tasks[0].key, p.tasks[0].step, p.tasks[0].deadline),
        (roots[0].key, 0, at(53))
    );
    assert_eq!(run.outstanding(), 1);
    // Served at 45 ms, past its planned deadline: `b` and `c` still make it.
    let p = run.done(roots[0].key, at(45), &[]).unwrap();
    let b_task = p.tasks[0].clone();
    assert_eq!(
        b_task.deadline,
        at(40),
        "b's planned deadline is already past"
    );
    let p = run.expired(b_task.key).unwrap();
    assert_eq!(p.tasks[0].deadline, at(57));
    let p = run.done(b_task.key, at(50), &[]).unwrap();
    let c_task = p.tasks[0].clone();
    let end = run.done(c_task.key, at(56), &[]).unwrap().end.unwrap();
    assert_eq!(end.outcome, Outcome::Good);
    assert!(run.ended());
}

#[test]
fn a_task_dropped_at_its_last_deadline_ends_its_request_once() {
    let (g, b) = chain_latest();
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::LatestUseful, at(0));
    let p = run.done(roots[0].key, at(10), &[]).unwrap();
    let k = p.tasks[0].key;
    let again = run.expired(k).unwrap();
    assert_eq!(again.tasks[0].deadline, at(57));
    // Dropped again, at its last deadline: the request ends, once.
    let end = run.expired(k).unwrap().end.unwrap();
    assert_eq!(end.outcome, Outcome::Expired { task: k, step: 1 });
    assert!(end.cancelled.is_empty());
    assert_eq!(run.expired(k), Err(AppError::NotOutstanding(k)));
    assert_eq!(run.abort("late"), None);
    // Under slack forwarding the first drop ends it.
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::SlackForwarding, at(0));
    let p = run.expired(roots[0].key).unwrap();
    assert!(p.tasks.is_empty());
    assert_eq!(
        p.end.unwrap().outcome,
        Outcome::Expired {
            task: roots[0].key,
            step: 0
        }
    );
}

#[test]
fn a_cancelled_task_dropped_later_is_discarded_not_resubmitted() {
    let g = diamond();
    let b = budgets(&g, &[10, 10, 30, 10], 50)
        .with_least(&g, vec![ms(1); 4])
        .unwrap();
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::LatestUseful, at(0));
    let p = run.done(roots[0].key, at(5), &[]).unwrap();
    let end = run.failed(p.tasks[0].key, "backend error").unwrap().end;
    assert_eq!(end.unwrap().cancelled, vec![p.tasks[1].key]);
    let q = run.expired(p.tasks[1].key).unwrap();
    assert!(q.discard && q.tasks.is_empty() && q.end.is_none());
    assert_eq!(run.unreported(), 0);
}

#[test]
fn the_task_bound_fails_a_request_whose_fanout_is_too_large() {
    let g = Arc::new(
        Graph::new(
            vec![Step::new("det", "ssd"), Step::new("cls", "resnet")],
            &[EdgeSpec::fanout("det", "cls")],
            &["cls"],
        )
        .unwrap()
        .with_max_tasks(10),
    );
    let b = budgets(&g, &[10, 10], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let p = run.done(roots[0].key, at(1), &[(0, u32::MAX)]).unwrap();
    assert!(p.tasks.is_empty());
    let end = p.end.unwrap();
    assert!(end.outcome.is_failed());
    let Outcome::Failed { reason, .. } = end.outcome else {
        unreachable!()
    };
    assert!(reason.contains("'det' -> 'cls'"), "{reason}");
    assert!(run.ended());
}

#[test]
fn abort_ends_an_open_request_once() {
    let g = det_cls();
    let b = budgets(&g, &[10, 10], 30);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    let end = run.abort("client left").unwrap();
    assert!(end.outcome.is_failed());
    assert_eq!(end.cancelled, vec![roots[0].key]);
    assert!(run.abort("again").is_none());
    assert!(run.done(roots[0].key, at(1), &[(0, 1)]).unwrap().discard);
}

#[test]
fn validation_names_the_steps_at_fault() {
    let s = |names: &[&str]| names.iter().map(|n| Step::new(n, "m")).collect::<Vec<_>>();
    let err = |steps: Vec<Step>, edges: &[EdgeSpec], outs: &[&str]| {
        Graph::new(steps, edges, outs).unwrap_err()
    };
    assert_eq!(err(vec![], &[], &["a"]), GraphError::Empty);
    assert_eq!(
        err(s(&["a", "a"]), &[], &["a"]),
        GraphError::DuplicateStep("a".into())
    );
    let e = err(s(&["a", "b"]), &[EdgeSpec::whole("a", "x")], &["b"]);
    assert!(e.to_string().contains("'x'"), "{e}");
    assert_eq!(
        err(s(&["a"]), &[EdgeSpec::whole("a", "a")], &["a"]),
        GraphError::SelfLoop("a".into())
    );
    assert_eq!(
        err(
            s(&["a", "b"]),
            &[EdgeSpec::whole("a", "b"), EdgeSpec::fanout("a", "b")],
            &["b"]
        ),
        GraphError::DuplicateEdge("a".into(), "b".into())
    );
    let e = err(
        s(&["r", "a", "b", "c"]),
        &[
            EdgeSpec::whole("r", "a"),
            EdgeSpec::whole("a", "b"),
            EdgeSpec::whole("b", "c"),
            EdgeSpec::whole("c", "a"),
        ],
        &["c"],
    );
    let GraphError::Cycle(c) = &e else {
        panic!("{e}")
    };
    assert_eq!(c.first(), c.last());
    let mut on: Vec<&str> = c[1..].iter().map(|s| s.as_str()).collect();
    on.sort();
    assert_eq!(on, vec!["a", "b", "c"]);
    assert!(e.to_string().contains("cycle"), "{e}");
    // A join of a fanned-out branch and a whole one.
    let e = err(
        s(&["det", "cls", "meta", "join"]),
        &[
            EdgeSpec::fanout("det", "cls"),
            EdgeSpec::whole("det", "meta"),
            EdgeSpec::whole("cls", "join"),
            EdgeSpec::whole("meta", "join"),
        ],
        &["join"],
    );
    let msg = e.to_string();
    assert!(matches!(e, GraphError::JoinContexts { ref join, .. } if join == "join"));
    assert!(msg.contains("'cls' (fanned out by det->cls)"), "{msg}");
    assert!(msg.contains("'meta' (not fanned out)"), "{msg}");
    // A fan-out edge straight into a join.
    let e = err(
        s(&["a", "b", "j"]),
        &[EdgeSpec::fanout("a", "j"), EdgeSpec::whole("b", "j")],
        &["j"],
    );
    assert!(matches!(e, GraphError::JoinContexts { .. }), "{e}");
    assert_eq!(
        err(s(&["a"]), &[], &["z"]),
        GraphError::UnknownOutput("z".into())
    );
    assert_eq!(err(s(&["a"]), &[], &[]), GraphError::NoOutputs);
    // Budgets must match the graph.
    let g = det_cls();
    assert_eq!(
        Budgets::new(&g, vec![ms(1)], ms(10)),
        Err(BudgetError::Count {
            steps: 2,
            budgets: 1
        })
    );
    assert_eq!(
        Budgets::new(&g, vec![ms(1), ms(-1)], ms(10)),
        Err(BudgetError::Negative("cls".into()))
    );
    assert_eq!(
        Budgets::new(&g, vec![ms(1), ms(1)], Dur::ZERO),
        Err(BudgetError::Slo)
    );
}

#[test]
fn two_roots_join_and_a_root_output_is_one_task() {
    let g = Arc::new(
        Graph::new(
            vec![
                Step::new("x", "m"),
                Step::new("y", "m"),
                Step::new("j", "m"),
            ],
            &[EdgeSpec::whole("x", "j"), EdgeSpec::whole("y", "j")],
            &["x", "j"],
        )
        .unwrap(),
    );
    let b = budgets(&g, &[5, 7, 5], 20);
    let (mut run, roots) = AppRun::start(&g, &b, DeadlineRule::Static, at(0));
    assert_eq!(roots.len(), 2);
    assert!(run.done(roots[1].key, at(2), &[]).unwrap().tasks.is_empty());
    let p = run.done(roots[0].key, at(3), &[]).unwrap();
    assert_eq!(p.tasks[0].deadline, at(12));
    let end = run.done(p.tasks[0].key, at(9), &[]).unwrap().end.unwrap();
    assert_eq!(
        end.outputs,
        Some(vec![vec![roots[0].key], vec![p.tasks[0].key]])
    );
}
