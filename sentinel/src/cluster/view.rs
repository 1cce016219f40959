/// A worker Deployment as the cluster sees it. `None` means unknown (no Kubernetes access, the
/// first list not done yet, or the watch failing), which is never shown as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// `spec.replicas`: the count the autoscaler set.
    pub workers: Option<u32>,
    /// Pods that are Ready and not being deleted.
    pub running: Option<u32>,
    /// Pods the scheduler could not place (PodScheduled=False, reason Unschedulable).
    pub waiting: Option<u32>,
    /// Pods being deleted (draining their tasks).
    pub terminating: Option<u32>,
}
