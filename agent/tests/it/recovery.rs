//! After an api-server outage the agent is back at work within seconds, however long the
//! outage lasted (its retries back off, but not for long).

use std::time::{Duration, Instant};
use test_kit::agent_process::start_agent;
use test_kit::fake_edge_api::FakeAirflow;

const T: Duration = Duration::from_secs(20);
/// Long enough for an uncapped exponential backoff to have grown to tens of seconds.
const OUTAGE: Duration = Duration::from_secs(25);

#[tokio::test]
async fn fetches_again_within_5_s_of_the_api_server_coming_back() {
    let fake = FakeAirflow::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&fake, dir.path(), &[]).await;
    agent.until(&fake, "fetching", T, |s| s.fetches > 0).await;
    let down = fake.with(|s| {
        s.down = true;
        s.fetch_attempts.len()
    });
    // The outage itself: the agent is meant to be left alone for this long.
    tokio::time::sleep(OUTAGE).await;
    let fetches = fake.with(|s| {
        s.down = false;
        s.fetches
    });
    let back = Instant::now();
    agent
        .until(&fake, "a fetch after the outage", T, |s| {
            s.fetches > fetches
        })
        .await;
    let recovered = back.elapsed();
    eprintln!("fetched again {recovered:?} after a {OUTAGE:?} outage ended");
    assert!(recovered < Duration::from_secs(5), "{recovered:?}");
    // Not by luck: no retry during the outage waited that long either.
    let attempts = fake.with(|s| s.fetch_attempts[down..].to_vec());
    let longest = attempts.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    eprintln!(
        "{} fetch attempts during the outage, at most {longest:?} apart",
        attempts.len()
    );
    assert!(
        longest < Duration::from_secs(5),
        "{longest:?} between two attempts"
    );
}
