//! The Rust client against a server that goes away mid-batch: every call must end exactly
//! once, with its own reply or a typed error, whatever the server had answered by then.
//!
//! The server under test serves `echo`/`echo` and is made to go away by whoever runs the
//! check (the check cannot reach another process): a batch streams through it while it is up;
//! once half the items are answered the check asks for the server to be stopped (so that
//! what is sent next stays unanswered: SIGSTOP), sends single calls and the rest of the
//! batch's window, and once they are all in flight asks for it to go away (SIGKILL). Then it
//! waits, within a deadline, for every item and call to end, and checks each one.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout};
use volley::{BatchOptions, Client, ClientConfig, Error};

use crate::Report;
use crate::interop::ECHO;

/// The shape of the traffic: a batch of `items` in chunks of `chunk` with `window` chunks in
/// flight, and `singles` single calls sent once the server is stopped. `wait` bounds each
/// wait for a condition, and the wait for every call to end once the server is gone (default
/// 60 s: generous, for a loaded machine, and far below the calls' own deadline, so a call
/// that ends only by its deadline counts as lost).
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub items: usize,
    pub chunk: usize,
    pub window: usize,
    pub singles: usize,
    pub wait: Duration,
}

impl Default for Plan {
    fn default() -> Self {
        Plan { items: 10_000, chunk: 100, window: 8, singles: 100, wait: Duration::from_secs(60) }
    }
}

/// Where the check waits for the server to be acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Half the batch is answered: stop the server (it must read nothing more).
    Stop { answered: usize, items: usize },
    /// Calls are in flight to the stopped server: make it go away.
    GoAway { in_flight: usize },
}

/// The calls' deadline: they must end by the server's going away, long before this.
const CALL_DEADLINE: Duration = Duration::from_secs(3600);

/// Runs the check against the server at `addr` (requiring `token` if given); `step` is called
/// at each [`Step`] and returns once the server has been acted on.
pub async fn check<F, Fut>(addr: &str, token: Option<&str>, plan: Plan, mut step: F) -> Report
where
    F: FnMut(Step) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut report = Report::default();
    let case = "every item of the batch and every call ended once, with its reply or a connection error";
    report.cases.push(match run(addr, token, plan, &mut step).await {
        Ok(summary) => (format!("{case}: {summary}"), Ok(())),
        Err(e) => (case.into(), Err(e)),
    });
    report
}

async fn run<F, Fut>(addr: &str, token: Option<&str>, plan: Plan, step: &mut F) -> Result<String, String>
where
    F: FnMut(Step) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut config = ClientConfig::default().timeout(CALL_DEADLINE);
    if let Some(t) = token {
        config = config.token(t.as_bytes().to_vec());
    }
    let client = Client::connect_with(addr, config).await.map_err(|e| format!("connecting: {e}"))?;
    client.call(&ECHO, Bytes::from_static(b"up")).await.map_err(|e| format!("the first call: {e}"))?;
    let items: Vec<Bytes> = (0..plan.items as u32).map(|i| Bytes::from(i.to_le_bytes().to_vec())).collect();
    let half = plan.items / 2;
    let (halfway, go_on) = (oneshot::channel(), oneshot::channel());
    let batch = tokio::spawn(stream_batch(client.clone(), items.clone(), plan, half, halfway.0, go_on.1));
    let wait = plan.wait;
    timeout(wait, halfway.1)
        .await
        .map_err(|_| format!("half the batch was not answered within {wait:?}"))?
        .map_err(|_| "the batch ended before half of it was answered".to_string())?;
    step(Step::Stop { answered: half, items: plan.items }).await?;
    let _ = go_on.0.send(());
    let singles: Vec<_> = (0..plan.singles as u32)
        .map(|i| {
            let (client, payload) = (client.clone(), Bytes::from(format!("single {i}")));
            tokio::spawn(async move { (client.call(&ECHO, payload.clone()).await, payload) })
        })
        .collect();
    let chunks_left = (plan.items - half).div_ceil(plan.chunk);
    let in_flight = plan.window.min(chunks_left) + plan.singles;
    wait_for(wait, || client.pending_calls() >= in_flight)
        .await
        .map_err(|_| format!("{} of {in_flight} calls in flight after {wait:?}", client.pending_calls()))?;
    step(Step::GoAway { in_flight: client.pending_calls() }).await?;
    let deadline = Instant::now() + wait;
    let results = tokio::time::timeout_at(deadline, batch)
        .await
        .map_err(|_| format!("the batch had not ended {wait:?} after the server went away"))?
        .map_err(|e| format!("the batch's task: {e}"))?;
    let mut ended = Vec::new();
    for single in singles {
        let joined = tokio::time::timeout_at(deadline, single)
            .await
            .map_err(|_| format!("a single call had not ended {wait:?} after the server went away"))?;
        ended.push(joined.map_err(|e| format!("a single call's task: {e}"))?);
    }
    judge(&items, half, &results, &ended)
}

/// Streams the batch, collecting one result per item as it comes; after `half` results it
/// says so and waits for `go_on` (the server is being stopped) before reading on.
async fn stream_batch(
    client: Client,
    items: Vec<Bytes>,
    plan: Plan,
    half: usize,
    halfway: oneshot::Sender<()>,
    go_on: oneshot::Receiver<()>,
) -> Vec<Result<Bytes, Error>> {
    let opts = BatchOptions::default().chunk_size(plan.chunk).window(plan.window).timeout(CALL_DEADLINE);
    let mut stream = client.call_batch_stream(&ECHO, items, opts);
    let mut results = Vec::with_capacity(plan.items);
    let (mut halfway, mut go_on) = (Some(halfway), Some(go_on));
    while let Some(result) = stream.next().await {
        results.push(result);
        if results.len() == half
            && let (Some(tell), Some(resume)) = (halfway.take(), go_on.take())
        {
            let _ = tell.send(());
            let _ = resume.await;
        }
    }
    results
}

async fn wait_for(wait: Duration, mut condition: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + wait;
    while !condition() {
        if Instant::now() > deadline {
            return Err(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The verdict on what each call ended with: one result per item, each the item's own reply
/// or a connection error (`Error::Connection`, or `Error::NotRun` for a call the connection's
/// end left unsent or the server's go-away left unrun); the first `answered` items (answered while the server was up)
/// replied; and the server's going away failed at least one call (or it did not go away
/// mid-batch). `singles`: each single call's result and payload. Returns a summary.
pub fn judge(
    items: &[Bytes],
    answered: usize,
    batch: &[Result<Bytes, Error>],
    singles: &[(Result<Bytes, Error>, Bytes)],
) -> Result<String, String> {
    if batch.len() != items.len() {
        return Err(format!("{} results for {} items: calls lost or doubled", batch.len(), items.len()));
    }
    let calls = items.iter().zip(batch).map(|(item, r)| (r, item)).chain(singles.iter().map(|(r, p)| (r, p)));
    let mut failed = 0;
    for (k, (result, sent)) in calls.enumerate() {
        let what = match k.checked_sub(items.len()) {
            None => format!("item {k}"),
            Some(s) => format!("single call {s}"),
        };
        match result {
            Ok(reply) if reply == sent => {}
            Ok(reply) => return Err(format!("{what} got another call's reply ({reply:?} for {sent:?})")),
            Err(Error::Connection(_) | Error::NotRun(_)) if k < answered => {
                return Err(format!("{what} failed, though it was answered before the server stopped"));
            }
            Err(Error::Connection(_) | Error::NotRun(_)) => failed += 1,
            Err(e) => return Err(format!("{what} ended with {e:?}, not a connection error")),
        }
    }
    if failed == 0 {
        return Err("no call failed: the server did not go away mid-batch".into());
    }
    let total = items.len() + singles.len();
    Ok(format!(
        "{total} calls ({} batch items, {} single): {} replied, {failed} connection errors",
        items.len(),
        singles.len(),
        total - failed
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: u32) -> Vec<Bytes> {
        (0..n).map(|i| Bytes::from(i.to_le_bytes().to_vec())).collect()
    }

    fn lost() -> Result<Bytes, Error> {
        Err(Error::Connection("gone".into()))
    }

    #[test]
    fn replies_then_connection_errors_pass() {
        let items = items(10);
        let mut batch: Vec<_> = items[..6].iter().cloned().map(Ok).collect();
        batch.extend((0..4).map(|_| lost()));
        let singles = vec![(lost(), Bytes::from("s0")), (Ok(Bytes::from("s1")), Bytes::from("s1"))];
        let summary = judge(&items, 5, &batch, &singles).unwrap();
        assert_eq!(summary, "12 calls (10 batch items, 2 single): 7 replied, 5 connection errors");
    }

    #[test]
    fn a_call_the_connection_left_unsent_is_a_connection_error_too() {
        let items = items(4);
        let mut batch: Vec<_> = items[..2].iter().cloned().map(Ok).collect();
        batch.extend([lost(), Err(Error::NotRun("reset (the request was never sent)".into()))]);
        let summary = judge(&items, 2, &batch, &[]).unwrap();
        assert_eq!(summary, "4 calls (4 batch items, 0 single): 2 replied, 2 connection errors");
        // Before the server stopped, not even that.
        assert!(judge(&items, 4, &batch, &[]).unwrap_err().contains("failed, though it was answered"));
    }

    #[test]
    fn a_lost_or_doubled_item_fails() {
        let items = items(4);
        let batch: Vec<_> = items[..3].iter().cloned().map(Ok).chain([lost()]).collect();
        assert!(judge(&items, 2, &batch[..3], &[]).unwrap_err().contains("3 results for 4 items"));
        let doubled: Vec<_> = batch.iter().cloned().chain([lost()]).collect();
        assert!(judge(&items, 2, &doubled, &[]).unwrap_err().contains("5 results for 4 items"));
    }

    #[test]
    fn another_items_reply_fails() {
        let items = items(4);
        let batch = vec![Ok(items[0].clone()), Ok(items[2].clone()), lost(), lost()];
        assert!(judge(&items, 1, &batch, &[]).unwrap_err().starts_with("item 1 got another call's reply"));
        let singles = vec![(Ok(Bytes::from("s1")), Bytes::from("s0"))];
        let ok: Vec<_> = vec![Ok(items[0].clone()), Ok(items[1].clone()), lost(), lost()];
        assert!(judge(&items, 1, &ok, &singles).unwrap_err().starts_with("single call 0 got another"));
    }

    #[test]
    fn an_error_other_than_the_connections_fails() {
        let items = items(3);
        let batch = vec![Ok(items[0].clone()), Err(Error::Timeout(Duration::from_secs(1))), lost()];
        assert!(judge(&items, 1, &batch, &[]).unwrap_err().contains("item 1 ended with Timeout"));
    }

    #[test]
    fn an_item_answered_before_the_stop_must_reply() {
        let items = items(3);
        let batch = vec![Ok(items[0].clone()), lost(), lost()];
        assert!(judge(&items, 2, &batch, &[]).unwrap_err().starts_with("item 1 failed, though"));
    }

    #[test]
    fn a_server_that_never_went_away_fails() {
        let items = items(3);
        let batch: Vec<_> = items.iter().cloned().map(Ok).collect();
        assert!(judge(&items, 1, &batch, &[]).unwrap_err().contains("did not go away"));
    }
}
