{{/*
The resolved worker list, which every worker object and the Sentinel's configuration render from.
*/}}

{{/*
Deep merge: copies .src into .dst in place. Maps merge key by key; lists and scalars replace;
a null in .src leaves the default. (Sprig's merge helpers skip false/0/"" from the source, which
would make `keda.enabled: false` or `minReplicaCount: 0` in a worker entry lose to a default.)
*/}}
{{- define "astro-agent.merge" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- if kindIs "map" $v -}}
{{- $cur := get $dst $k -}}
{{- if kindIs "map" $cur -}}
{{- include "astro-agent.merge" (dict "dst" $cur "src" $v) -}}
{{- else -}}
{{- $_ := set $dst $k (deepCopy $v) -}}
{{- end -}}
{{- else if not (kindIs "invalid" $v) -}}
{{- $_ := set $dst $k $v -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The resolved worker list: each `workers` entry merged over `workerDefaults`, validated, and
completed with derived fields. Returns JSON {"workers": [...]}; templates read it with fromJson.
Derived fields: deploymentName, queueList, mode ("keda" | "hpa" | "fixed"), drainTimeoutSeconds,
taskEnvAllowList (ASTRO_AGENT_TASK_ENV_ALLOW), hpaTarget (HPA averageValue), fallbackReplicas and
kedaFallback (whether the ScaledObject gets KEDA's fallback).
Every refusal names the key and the fix.
*/}}
{{- define "astro-agent.workers" -}}
{{- $root := . -}}
{{- $prefix := include "astro-agent.prefix" . -}}
{{- $out := list -}}
{{- $seen := dict -}}
{{- if not (kindIs "slice" .Values.workers) -}}
{{- fail "workers must be a list of worker entries (each with a name)" -}}
{{- end -}}
{{- range $i, $entry := .Values.workers -}}
{{- $at := printf "workers[%d]" $i -}}
{{- if not (kindIs "map" $entry) -}}
{{- fail (printf "%s must be a map with at least a name" $at) -}}
{{- end -}}
{{- $w := deepCopy $root.Values.workerDefaults -}}
{{- include "astro-agent.merge" (dict "dst" $w "src" $entry) -}}
{{- $name := toString (default "" $w.name) -}}
{{- if not $name -}}
{{- fail (printf "%s.name is required: it names the Deployment <resourceNamePrefix>-worker-<name>" $at) -}}
{{- end -}}
{{- $at = printf "workers[%d] (%s)" $i $name -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "workers[%d].name %q is a duplicate of workers[%v].name: worker names must be unique" $i $name (get $seen $name)) -}}
{{- end -}}
{{- $_ := set $seen $name $i -}}
{{- $deploy := printf "%s-worker-%s" $prefix $name -}}
{{- if or (gt (len $deploy) 63) (not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $deploy)) -}}
{{- fail (printf "workers[%d].name %q gives the Deployment name %q, which must be a DNS label: lowercase letters, digits and '-', at most 63 characters" $i $name $deploy) -}}
{{- end -}}
{{- $_ := set $w "deploymentName" $deploy -}}

{{- /* queues: a list or a comma-separated string */ -}}
{{- $raw := $w.queues -}}
{{- if kindIs "string" $raw -}}{{- $raw = splitList "," $raw -}}{{- end -}}
{{- $queues := list -}}
{{- range $q := ($raw | default list) -}}
{{- $q = trim (toString $q) -}}
{{- if $q -}}{{- $queues = append $queues $q -}}{{- end -}}
{{- end -}}
{{- if not $queues -}}
{{- fail (printf "workers[%d].queues is empty: give the worker at least one Airflow queue, e.g. queues: [default]" $i) -}}
{{- end -}}
{{- $_ := set $w "queueList" (uniq $queues) -}}

{{- $slots := int $w.syncSlots -}}
{{- if lt $slots 1 -}}
{{- fail (printf "workers[%d].syncSlots is %d: it must be at least 1 (concurrent tasks per Pod)" $i $slots) -}}
{{- end -}}

{{- /* Drain deadline: grace minus margin. After the deadline the agent spends up to the whole
       margin (10 s for tasks to exit, their final reports, 10 s to report offline, 5 s to exit:
       agent/src/stop_budget.rs), all before the kubelet's SIGKILL at the end of the grace
       period; a margin below 35 s would leave the reports too little, and the agent refuses it. */ -}}
{{- $grace := int $w.terminationGracePeriodSeconds -}}
{{- if lt $grace 1 -}}
{{- fail (printf "workers[%d].terminationGracePeriodSeconds is %d: it must be at least 1 so the agent can drain its tasks" $i $grace) -}}
{{- end -}}
{{- $margin := int $w.drainMarginSeconds -}}
{{- if lt $margin 35 -}}
{{- fail (printf "workers[%d].drainMarginSeconds is %d: it must be at least 35 (after the drain deadline the agent needs 10s to stop tasks, at least 10s for their final reports, 10s to report offline and 5s to exit, before the kubelet's SIGKILL)" $i $margin) -}}
{{- end -}}
{{- if le $grace $margin -}}
{{- fail (printf "workers[%d].terminationGracePeriodSeconds (%d) must be greater than workers[%d].drainMarginSeconds (%d): the drain deadline is their difference" $i $grace $i $margin) -}}
{{- end -}}
{{- $_ := set $w "drainTimeoutSeconds" (sub $grace $margin) -}}

{{- $conn := $w.adminServer -}}
{{- if ge (int $conn.reservedConnections) (int $conn.maxConnections) -}}
{{- fail (printf "workers[%d].adminServer.reservedConnections (%d) must be less than workers[%d].adminServer.maxConnections (%d): the reserve is a part of them" $i (int $conn.reservedConnections) $i (int $conn.maxConnections)) -}}
{{- end -}}

{{- /* The tasks container. Its image is the user's Airflow: the chart's appVersion (the agent's)
       is no tag for it. Its env must hold none of the agent's settings, which carry credentials. */ -}}
{{- if not (or $w.tasks.image.tag $w.tasks.image.digest) -}}
{{- fail (printf "workers[%d].tasks.image has neither a tag nor a digest: give the tag of the Airflow image the tasks run in, e.g. tasks.image.tag: \"3.3.2\"" $i) -}}
{{- end -}}
{{- /* Tasks inherit an allowlist of the tasks container's variables: the agent's built-in one,
       taskEnvAllow, and the names the chart sets there (tasks.env). AIRFLOW_* names are left out:
       the built-in list passes them already, and the agent refuses to start when the list names
       one of the Airflow server secrets it never passes (the Fernet key, the JWT secret, ...). */ -}}
{{- $allow := $w.taskEnvAllow | default list -}}
{{- range $j, $e := $w.tasks.env | default list -}}
{{- $n := toString (default "" $e.name) -}}
{{- if hasPrefix "ASTRO_AGENT_" $n -}}
{{- fail (printf "workers[%d].tasks.env[%d] is %s: the agent's settings go in workers[%d].env (the agent container); the tasks container gets none of them" $i $j $n $i) -}}
{{- end -}}
{{- if not (hasPrefix "AIRFLOW_" $n) -}}
{{- $allow = append $allow $n -}}
{{- end -}}
{{- end -}}
{{- $_ := set $w "taskEnvAllowList" (uniq $allow) -}}
{{- /* The agent settings the chart derives from its own values: set again in env, they would
       silently win over the value the autoscaler divides by or counts with. */ -}}
{{- $fromValues := dict "ASTRO_AGENT_SYNC_SLOTS" "syncSlots" "ASTRO_AGENT_QUEUES" "queues" "ASTRO_AGENT_DRAIN_TIMEOUT" "terminationGracePeriodSeconds and drainMarginSeconds" "ASTRO_AGENT_DRAIN_MARGIN" "drainMarginSeconds" "ASTRO_AGENT_ADMIN_MAX_CONNECTIONS" "adminServer.maxConnections" "ASTRO_AGENT_ADMIN_MAX_CONNECTIONS_PER_PEER" "adminServer.maxConnectionsPerPeer" "ASTRO_AGENT_ADMIN_RESERVED_CONNECTIONS" "adminServer.reservedConnections" "ASTRO_AGENT_LOG_FOLDER" "logFolder" "ASTRO_AGENT_LOG_FORMAT" "logFormat" "ASTRO_AGENT_PYTHON" "tasks.python" "ASTRO_AGENT_WORKER_NAME" "the Pod's name (set by the chart)" -}}
{{- range $j, $e := $w.env | default list -}}
{{- $n := toString (default "" $e.name) -}}
{{- if hasKey $fromValues $n -}}
{{- fail (printf "workers[%d].env[%d] is %s: set workers[%d].%s instead (the chart passes it to the agent, and the autoscaler uses the same value)" $i $j $n $i (get $fromValues $n)) -}}
{{- end -}}
{{- end -}}

{{- $keda := $w.keda.enabled -}}
{{- $hpa := $w.hpa.enabled -}}
{{- if and $keda $hpa -}}
{{- fail (printf "workers[%d].keda.enabled and workers[%d].hpa.enabled are both true (worker %q): a Deployment takes one autoscaler; set one of them to false" $i $i $name) -}}
{{- end -}}
{{- if $keda -}}
{{- $_ := set $w "mode" "keda" -}}
{{- if not $root.Values.sentinel.enabled -}}
{{- fail (printf "workers[%d].keda.enabled is true (worker %q) but sentinel.enabled is false: KEDA reads the backlog from the Sentinel; set sentinel.enabled: true" $i $name) -}}
{{- end -}}
{{- $min := int $w.keda.minReplicaCount -}}
{{- $max := int $w.keda.maxReplicaCount -}}
{{- if lt $min 0 -}}
{{- fail (printf "workers[%d].keda.minReplicaCount is %d: it must be 0 or more" $i $min) -}}
{{- end -}}
{{- if lt $max 1 -}}
{{- fail (printf "workers[%d].keda.maxReplicaCount is %d: it must be at least 1" $i $max) -}}
{{- end -}}
{{- if gt $min $max -}}
{{- fail (printf "workers[%d].keda.minReplicaCount (%d) is greater than workers[%d].keda.maxReplicaCount (%d)" $i $min $i $max) -}}
{{- end -}}
{{- $trigger := toString (default "metrics-api" $w.keda.trigger) -}}
{{- if not (has $trigger (list "metrics-api" "external-push")) -}}
{{- fail (printf "workers[%d].keda.trigger is %q: use metrics-api or external-push" $i $trigger) -}}
{{- end -}}
{{- $_ := set $w.keda "trigger" $trigger -}}
{{- $headroom := int (default 0 $w.keda.overprovisionSlots) -}}
{{- if lt $headroom 0 -}}
{{- fail (printf "workers[%d].keda.overprovisionSlots is %d: it must be 0 or more (slots kept free above the work)" $i $headroom) -}}
{{- end -}}
{{- if ge $headroom (mul $max $slots) -}}
{{- fail (printf "workers[%d].keda.overprovisionSlots is %d: it must be below keda.maxReplicaCount × syncSlots (%d), or the pool would always be at its maximum" $i $headroom (mul $max $slots)) -}}
{{- end -}}
{{- $_ := set $w.keda "overprovisionSlots" $headroom -}}
{{- /* The fallback holds a pool while the Sentinel cannot answer; it never raises one from zero.
       KEDA (>= 2.19) takes an applied fallback for an active trigger whatever its replica count,
       and wakes a Deployment at zero with it: with a fallback, every Sentinel outage longer than
       failureThreshold polls (its first start after an install among them) would give each idle
       pool a worker, then keep it for the cooldown. So the fallback's replicas default to
       minReplicaCount and a fallback of 0 replicas is left out: without one, KEDA neither scales
       on a failed read nor takes a pool to zero, and its HPA keeps its replicas while its metrics
       fail, which holds a running pool and leaves an idle one at zero. */ -}}
{{- $fb := $w.keda.fallback.replicas -}}
{{- if kindIs "invalid" $fb -}}{{- $fb = $min -}}{{- end -}}
{{- $_ := set $w "fallbackReplicas" (int $fb) -}}
{{- $_ := set $w "kedaFallback" (and $w.keda.fallback.enabled (gt (int $fb) 0)) -}}
{{- else if $hpa -}}
{{- $_ := set $w "mode" "hpa" -}}
{{- $min := int $w.hpa.minReplicaCount -}}
{{- $max := int $w.hpa.maxReplicaCount -}}
{{- if lt $min 1 -}}
{{- fail (printf "workers[%d].hpa.minReplicaCount is %d: an HPA needs at least 1 (only KEDA scales to zero; use workers[%d].keda instead)" $i $min $i) -}}
{{- end -}}
{{- if gt $min $max -}}
{{- fail (printf "workers[%d].hpa.minReplicaCount (%d) is greater than workers[%d].hpa.maxReplicaCount (%d)" $i $min $i $max) -}}
{{- end -}}
{{- if $w.hpa.metric.enabled -}}
{{- if ne (toString $w.hpa.metric.target.type) "AverageValue" -}}
{{- fail (printf "workers[%d].hpa.metric.target.type is %q: queue depth needs AverageValue (a Value target multiplies by the current replicas every cycle)" $i (toString $w.hpa.metric.target.type)) -}}
{{- end -}}
{{- if not $root.Values.airflow.restApi.url -}}
{{- fail (printf "workers[%d].hpa.enabled is true (worker %q) but airflow.restApi.url is empty: the agent reads the queue stats the HPA scales on from Airflow's REST API" $i $name) -}}
{{- end -}}
{{- else if not $w.hpa.extraMetrics -}}
{{- fail (printf "workers[%d].hpa has no metric: enable workers[%d].hpa.metric or give workers[%d].hpa.extraMetrics" $i $i $i) -}}
{{- end -}}
{{- $target := toString (default "" $w.hpa.metric.target.averageValue) -}}
{{- if not $target -}}{{- $target = toString $slots -}}{{- end -}}
{{- $_ := set $w "hpaTarget" $target -}}
{{- /* Pre-warm on the HPA path: asked for explicitly (hpa.preWarmMetric), and only where the
       Sentinel can serve the metric. */ -}}
{{- $hpaPreWarm := and $w.hpa.preWarmMetric.enabled $w.preWarm.enabled -}}
{{- if and $hpaPreWarm (not $root.Values.sentinel.enabled) -}}
{{- fail (printf "workers[%d].hpa.preWarmMetric.enabled is true (worker %q) but sentinel.enabled is false: the expected slots come from the Sentinel" $i $name) -}}
{{- end -}}
{{- $_ := set $w "hpaPreWarm" (not (not $hpaPreWarm)) -}}
{{- else -}}
{{- $_ := set $w "mode" "fixed" -}}
{{- end -}}
{{- /* The Sentinel's queue-event stream wakes idle agents of the KEDA workers, whose queues it
       reads (the others' queues it does not know). */ -}}
{{- $_ := set $w "wakeOn" (and (eq $w.mode "keda") $w.wake.enabled) -}}
{{- $_ := set $w "serviceAccountUser" (printf "system:serviceaccount:%s:%s" $root.Release.Namespace (default "default" $w.serviceAccountName)) -}}
{{- $out = append $out $w -}}
{{- end -}}
{{- toJson (dict "workers" $out) -}}
{{- end -}}

{{/* The service-account usernames of the workers whose agents subscribe to the Sentinel, as
JSON {"users": [...]}: the Sentinel's allow-list for the queue-event stream. */}}
{{- define "astro-agent.wakeUsers" -}}
{{- $users := list -}}
{{- range $w := (include "astro-agent.workers" . | fromJson).workers -}}
{{- if $w.wakeOn -}}{{- $users = append $users $w.serviceAccountUser -}}{{- end -}}
{{- end -}}
{{- toJson (dict "users" (uniq $users)) -}}
{{- end -}}

{{/* The KEDA-enabled workers, as JSON {"workers": [...]}. */}}
{{- define "astro-agent.kedaWorkers" -}}
{{- $k := list -}}
{{- range $w := (include "astro-agent.workers" . | fromJson).workers -}}
{{- if eq $w.mode "keda" -}}{{- $k = append $k $w -}}{{- end -}}
{{- end -}}
{{- toJson (dict "workers" $k) -}}
{{- end -}}

{{/* "true" when a KEDA worker uses the external-push trigger: the Sentinel then serves KEDA's
external scaler API on its gRPC port, behind mutual TLS. */}}
{{- define "astro-agent.externalScalerEnabled" -}}
{{- range $w := (include "astro-agent.kedaWorkers" . | fromJson).workers -}}
{{- if eq $w.keda.trigger "external-push" -}}true{{- end -}}
{{- end -}}
{{- end -}}
