//! One bad request fails alone: when the executor fails a batch (a request
//! whose ids are outside an embedding table, a NaN that trips a check, any
//! input the model cannot take), [`run_isolating`] runs the two halves of the
//! batch again, and the halves of any half that fails, until the culprits are
//! alone; every other request gets its output. Finding one culprit in a batch
//! of b costs about 2·log2(b) extra runs of smaller batches; a budget
//! ([`ISOLATE_RUNS`]) bounds the cost when many fail (an executor that fails
//! everything, say), and what it leaves undecided fails.

use super::Executor;
use crate::core::ModelId;

/// Most extra runs spent finding the culprits of one failed batch: one culprit
/// in a batch of up to 2^12 (2 runs a level), or a few in smaller batches.
pub const ISOLATE_RUNS: usize = 24;

/// What [`run_isolating`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Isolated {
    /// Extra runs after the batch failed.
    pub reruns: usize,
    /// Requests that failed (alone, or left when the budget ran out).
    pub failed: usize,
}

/// Runs `inputs` as one batch of `model`; when the executor fails it (or
/// returns the wrong number of outputs), isolates the requests that fail.
/// One entry per input: its output, or `None` when it failed. `on_error`
/// hears each executor error (for the log).
pub fn run_isolating(
    exec: &mut dyn Executor,
    model: ModelId,
    inputs: &[&[u8]],
    on_error: &mut dyn FnMut(&anyhow::Error),
) -> (Vec<Option<Vec<u8>>>, Isolated) {
    let mut out: Vec<Option<Vec<u8>>> = vec![None; inputs.len()];
    let mut st = Isolated::default();
    if inputs.is_empty() {
        return (out, st);
    }
    match run(exec, model, inputs) {
        Ok(o) => {
            return (o.into_iter().map(Some).collect(), st);
        }
        Err(e) => on_error(&e),
    }
    if inputs.len() > 1 {
        let mut budget = ISOLATE_RUNS;
        halve(exec, model, inputs, 0, &mut out, &mut budget, on_error);
        st.reruns = ISOLATE_RUNS - budget;
    }
    st.failed = out.iter().filter(|o| o.is_none()).count();
    (out, st)
}

/// `inputs` (at `base` in the batch) failed as a whole and has at least two:
/// runs each half, and halves again what fails.
fn halve(
    exec: &mut dyn Executor,
    model: ModelId,
    inputs: &[&[u8]],
    base: usize,
    out: &mut [Option<Vec<u8>>],
    budget: &mut usize,
    on_error: &mut dyn FnMut(&anyhow::Error),
) {
    let mid = inputs.len() / 2;
    for (lo, part) in [(0, &inputs[..mid]), (mid, &inputs[mid..])] {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        match run(exec, model, part) {
            Ok(o) => {
                for (k, v) in o.into_iter().enumerate() {
                    out[base + lo + k] = Some(v);
                }
            }
            Err(_) if part.len() == 1 => {} // a culprit, alone
            Err(e) => {
                on_error(&e);
                halve(exec, model, part, base + lo, out, budget, on_error);
            }
        }
    }
}

/// One run; the wrong number of outputs is an error too.
fn run(exec: &mut dyn Executor, model: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>> {
    let o = exec.run(model, inputs)?;
    if o.len() != inputs.len() {
        anyhow::bail!(
            "the executor returned {} outputs for {} inputs",
            o.len(),
            inputs.len()
        );
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ModelInfo;

    /// Fails any batch holding an input that starts with 0xFF; counts runs.
    struct Picky {
        runs: usize,
    }

    impl Executor for Picky {
        fn name(&self) -> &'static str {
            "picky"
        }
        fn load(&mut self, _: &ModelInfo) -> anyhow::Result<()> {
            Ok(())
        }
        fn unload(&mut self, _: ModelId) {}
        fn run(&mut self, _: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>> {
            self.runs += 1;
            if inputs.iter().any(|i| i[0] == 0xFF) {
                anyhow::bail!("index out of range");
            }
            Ok(inputs.iter().map(|i| vec![i[0] + 1]).collect())
        }
    }

    fn batch(n: usize, bad: &[usize]) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| vec![if bad.contains(&i) { 0xFF } else { i as u8 }])
            .collect()
    }

    fn go(n: usize, bad: &[usize]) -> (Vec<Option<Vec<u8>>>, Isolated, usize) {
        let b = batch(n, bad);
        let refs: Vec<&[u8]> = b.iter().map(|v| v.as_slice()).collect();
        let mut e = Picky { runs: 0 };
        let mut errors = 0;
        let (o, st) = run_isolating(&mut e, ModelId(0), &refs, &mut |_| errors += 1);
        assert!(errors >= 1 || bad.is_empty());
        (o, st, e.runs)
    }

    #[test]
    fn only_the_culprits_fail_and_everyone_else_gets_their_output() {
        for n in [1, 2, 3, 7, 8, 33, 64] {
            for bad in [vec![], vec![0], vec![n - 1], vec![n / 2], vec![0, n - 1]] {
                let (o, st, runs) = go(n, &bad);
                for (i, v) in o.iter().enumerate() {
                    if bad.contains(&i) {
                        assert!(v.is_none(), "n {n} bad {bad:?}: {i} must fail");
                    } else {
                        assert_eq!(
                            v.as_deref(),
                            Some(&[i as u8 + 1][..]),
                            "n {n} bad {bad:?}: {i}"
                        );
                    }
                }
                let nbad = bad.iter().collect::<std::collections::HashSet<_>>().len();
                assert_eq!(st.failed, nbad);
                assert_eq!(runs, 1 + st.reruns);
                if nbad == 1 {
                    // log2(64) = 6 levels of two runs.
                    assert!(st.reruns <= 2 * 7, "n {n}: {} reruns", st.reruns);
                }
            }
        }
    }

    #[test]
    fn the_budget_bounds_the_reruns_when_everything_fails() {
        let all: Vec<usize> = (0..64).collect();
        let (o, st, runs) = go(64, &all);
        assert!(o.iter().all(|v| v.is_none()));
        assert_eq!(st.reruns, ISOLATE_RUNS);
        assert_eq!(runs, 1 + ISOLATE_RUNS);
        assert_eq!(st.failed, 64);
    }
}
