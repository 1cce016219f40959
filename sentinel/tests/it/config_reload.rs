//! A changed configuration file is applied by the running `astro-sentinel` process, with no
//! restart: a new worker is served, an edited one answers with its new settings, and the
//! history of the workers that stay is kept. The file is mounted as the kubelet mounts a
//! ConfigMap (`config.yaml` → `..data/config.yaml`, `..data` → a timestamped folder, swapped
//! atomically), so the test sees what a Pod sees. An invalid file is refused, named in the log
//! and counted, and the running configuration stays; a setting that cannot change at run time
//! keeps its value, with a log line saying so. An HPA-scaled worker is recorded too.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::sentinel_process::SentinelProcess;
use test_kit::{eventually, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");

/// A folder laid out as the kubelet lays out a ConfigMap volume.
struct ConfigMapVolume {
    dir: PathBuf,
    version: u32,
}

impl ConfigMapVolume {
    fn new(dir: &Path, content: &str) -> ConfigMapVolume {
        let mut volume = ConfigMapVolume {
            dir: dir.to_path_buf(),
            version: 0,
        };
        volume.update(content);
        symlink("..data/config.yaml", dir.join("config.yaml")).unwrap();
        volume
    }

    /// The kubelet's update: a new folder, a new `..data` link renamed over the old one.
    fn update(&mut self, content: &str) {
        self.version += 1;
        let folder = format!("..2025_01_01_00_00_0{}.000", self.version);
        std::fs::create_dir(self.dir.join(&folder)).unwrap();
        std::fs::write(self.dir.join(&folder).join("config.yaml"), content).unwrap();
        let staged = self.dir.join("..data_tmp");
        symlink(&folder, &staged).unwrap();
        std::fs::rename(&staged, self.dir.join("..data")).unwrap();
    }

    fn path(&self) -> PathBuf {
        self.dir.join("config.yaml")
    }
}

fn config(airflow: &str, workers: &str) -> String {
    format!(
        "refreshInterval: 100ms
source: {{type: airflow-api, airflowApi: {{url: \"http://{airflow}\"}}}}
auth: {{disabled: true}}
workers:
{workers}"
    )
}

const DEFAULT_ONLY: &str =
    "  - {name: w-default, queues: [default], syncSlots: 4, maxReplicas: 5}\n";
const WITH_ETL: &str = "  - {name: w-default, queues: [default], syncSlots: 4, maxReplicas: 9}
  - {name: w-etl, queues: [etl], syncSlots: 2, maxReplicas: 3, scaledBy: hpa}
";

async fn history(sentinel: &SentinelProcess, worker: &str) -> serde_json::Value {
    let answer = keda_get(
        sentinel.addr,
        &format!("/v1/workers/{worker}/history?range=15m"),
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_applied_in_place_and_the_history_stays() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 8, 4);
    fake.set("etl", 3, 0);
    let airflow = upstream.addr.to_string();
    let dir = TempDir::new("config-reload");
    let mut volume = ConfigMapVolume::new(&dir.0, &config(&airflow, DEFAULT_ONLY));
    let mut sentinel = SentinelProcess::start(
        Path::new(BIN),
        &volume.path(),
        &["--config-check-interval", "100ms"],
        &[("ASTRO_SENTINEL_AIRFLOW_TOKEN", "airflow-token")],
    );

    let before = eventually(Duration::from_secs(30), "a first history point", || async {
        let h = history(&sentinel, "w-default").await;
        (!h["series"].as_array().unwrap().is_empty()).then_some(h)
    })
    .await;
    let since = before["recordingSince"].as_str().unwrap().to_string();
    assert_eq!(before["historyKept"], "memory");
    assert_eq!(before["scaledBy"], "keda");
    assert_eq!(
        keda_get(sentinel.addr, "/v1/workers/w-etl", None)
            .await
            .status,
        404
    );
    assert_eq!(
        sentinel.metric("astro_sentinel_config_generation").await,
        Some(1.0)
    );

    // A pool added, another's maximum raised.
    volume.update(&config(&airflow, WITH_ETL));
    let etl = eventually(Duration::from_secs(30), "the new worker served", || async {
        let a = keda_get(sentinel.addr, "/v1/workers/w-etl", None).await;
        (a.status == 200).then(|| a.json())
    })
    .await;
    assert_eq!(
        (etl["backlog"].as_u64(), etl["maxReplicas"].as_u64()),
        (Some(3), Some(3))
    );
    let default = keda_get(sentinel.addr, "/v1/workers/w-default", None)
        .await
        .json();
    assert_eq!(default["maxReplicas"], 9);
    assert_eq!(
        default["backlog"], 12,
        "served at once: the unchanged queue's value carried over"
    );
    let after = history(&sentinel, "w-default").await;
    assert_eq!(
        after["recordingSince"], since,
        "the history of a worker that stays is kept"
    );
    assert_eq!(after["maxReplicas"], 9);
    assert_eq!(
        history(&sentinel, "w-etl").await["scaledBy"],
        "hpa",
        "recorded, not read by KEDA"
    );
    assert!(
        after["series"].as_array().unwrap().len() >= before["series"].as_array().unwrap().len()
    );
    assert_eq!(
        sentinel.metric("astro_sentinel_config_generation").await,
        Some(2.0)
    );
    assert!(sentinel.is_running(), "the same process all along");

    // An invalid file: refused, named, counted; the running configuration stays.
    volume.update(&config(
        &airflow,
        &WITH_ETL.replace("maxReplicas: 3", "maxReplicas: many"),
    ));
    eventually(Duration::from_secs(30), "the refusal counted", || async {
        (sentinel
            .metric("astro_sentinel_config_reload_failures_total")
            .await
            == Some(1.0))
        .then_some(())
    })
    .await;
    // The log is read from the process's stderr by another thread: it may trail the metric.
    let refused: Vec<String> =
        eventually(Duration::from_secs(30), "the refusal logged", || async {
            let refused: Vec<String> = sentinel
                .log()
                .into_iter()
                .filter(|l| l.contains("configuration change refused"))
                .collect();
            (!refused.is_empty()).then_some(refused)
        })
        .await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(
        refused[0].contains("w-etl") && refused[0].contains("maxReplicas"),
        "{}",
        refused[0]
    );
    assert_eq!(
        keda_get(sentinel.addr, "/v1/workers/w-etl", None)
            .await
            .status,
        200,
        "the running configuration is kept"
    );
    assert_eq!(
        sentinel.metric("astro_sentinel_config_generation").await,
        Some(2.0)
    );

    // A setting that cannot change at run time keeps its value; the rest applies.
    let moved = config("127.0.0.1:9", DEFAULT_ONLY);
    volume.update(&moved);
    eventually(Duration::from_secs(30), "the worker removed", || async {
        (keda_get(sentinel.addr, "/v1/workers/w-etl", None)
            .await
            .status
            == 404)
            .then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the kept source logged",
        || async {
            sentinel
                .log()
                .iter()
                .any(|l| l.contains("source cannot change while the Sentinel runs"))
                .then_some(())
        },
    )
    .await;
    let default = keda_get(sentinel.addr, "/v1/workers/w-default", None).await;
    assert_eq!(
        default.status, 200,
        "still reading the first source: {}",
        default.body
    );
    assert_eq!(sentinel.stop(), 0);
}
