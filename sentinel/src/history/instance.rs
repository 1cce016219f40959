//! The name this Sentinel replica gives in `recordedBy`: the pod's name (`POD_NAME`, or the
//! hostname, which Kubernetes sets to the pod's name), so the page can say which replica's
//! recording it shows.

pub fn instance_name() -> String {
    instance_name_from(
        |name| std::env::var(name).ok(),
        |path| std::fs::read_to_string(path).ok(),
    )
}

fn instance_name_from(
    env: impl Fn(&str) -> Option<String>,
    read_file: impl Fn(&str) -> Option<String>,
) -> String {
    let from_env = ["POD_NAME", "HOSTNAME"].into_iter().filter_map(&env);
    // The image has no shell to set HOSTNAME: the kernel's hostname is the pod's name there.
    let from_files = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .into_iter()
        .filter_map(&read_file);
    from_env
        .chain(from_files)
        .map(|name| name.trim().to_string())
        .find(|name| !name.is_empty())
        .unwrap_or_else(|| "astro-sentinel".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_name_first_then_hostname() {
        let env = |name: &str| match name {
            "POD_NAME" => Some("astro-sentinel-7d9f-abcde".to_string()),
            "HOSTNAME" => Some("other".to_string()),
            _ => None,
        };
        assert_eq!(
            instance_name_from(env, |_| None),
            "astro-sentinel-7d9f-abcde"
        );
        let kernel = |path: &str| (path == "/proc/sys/kernel/hostname").then(|| "node-a\n".into());
        assert_eq!(instance_name_from(|_| None, kernel), "node-a");
        let blank = |_: &str| Some("  ".to_string());
        assert_eq!(instance_name_from(blank, |_| None), "astro-sentinel");
    }
}
