//! Bursts of runs for the soak tests.

use std::sync::Arc;
use std::time::Duration;

use execbox::{ExecError, ExecRequest, ExecResult, Executor};

/// Runs `runs` requests through `exec`, at most `concurrency` at a time, on
/// a runtime of 4 workers whose blocking pool holds `concurrency` threads
/// (shut down before it returns). Run `i` is `job(i)`'s request; each
/// answer comes back in order with `job`'s other part.
pub fn burst<T: Send + 'static>(
    exec: &Executor,
    runs: usize,
    concurrency: usize,
    job: impl Fn(usize) -> (ExecRequest, T) + Send + Sync + 'static,
) -> Vec<(usize, T, Result<ExecResult, ExecError>)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .max_blocking_threads(concurrency)
        .enable_all()
        .build()
        .unwrap();
    let job = Arc::new(job);
    let outcomes = runtime.block_on(async {
        let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
        let mut tasks = Vec::new();
        for i in 0..runs {
            let (exec, gate, job) = (exec.clone(), gate.clone(), job.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                let (request, along) = job(i);
                (i, along, exec.execute(request).await)
            }));
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        outcomes
    });
    runtime.shutdown_timeout(Duration::from_secs(30));
    outcomes
}
