{{/*
Where the Sentinel keeps its history file: "" (history off: in memory only), "existingClaim",
"pvc" (a claim the chart makes) or "emptyDir" (lost with the Pod).
`auto` asks the cluster (`lookup`) for a default StorageClass, or for the claim an earlier
release made (so an upgrade never drops it); `helm template` and other renderers without
cluster access find neither, hence the advice to set `pvc` or `emptyDir` there.
A claim serves one Pod: with more replicas `auto` gives each one an `emptyDir`.
*/}}
{{- define "astro-agent.sentinelHistoryVolume" -}}
{{- $h := .Values.sentinel.history -}}
{{- $mode := toString $h.persistence.mode -}}
{{- if not $h.enabled -}}
{{- else if $h.existingClaim -}}existingClaim
{{- else if eq $mode "pvc" -}}pvc
{{- else if eq $mode "emptyDir" -}}emptyDir
{{- else if eq $mode "auto" -}}
{{- $claim := lookup "v1" "PersistentVolumeClaim" .Release.Namespace (include "astro-agent.sentinelHistoryClaimName" .) -}}
{{- $default := false -}}
{{- range $sc := (lookup "storage.k8s.io/v1" "StorageClass" "" "").items | default list -}}
{{- $annotations := $sc.metadata.annotations | default dict -}}
{{- if or (eq (toString (index $annotations "storageclass.kubernetes.io/is-default-class")) "true") (eq (toString (index $annotations "storageclass.beta.kubernetes.io/is-default-class")) "true") -}}
{{- $default = true -}}
{{- end -}}
{{- end -}}
{{- if $claim -}}pvc
{{- else if and $default (le (int .Values.sentinel.replicaCount) 1) -}}pvc
{{- else -}}emptyDir
{{- end -}}
{{- else -}}
{{- fail (printf "sentinel.history.persistence.mode is %q: use auto, pvc or emptyDir" $mode) -}}
{{- end -}}
{{- end -}}

{{- define "astro-agent.sentinelHistoryClaimName" -}}
{{- printf "%s-history" (include "astro-agent.sentinelName" .) -}}
{{- end -}}

{{/*
The Sentinel's configuration file, as JSON. Every worker Deployment that scales on its queues
is listed: the KEDA-scaled ones, which KEDA reads from the Sentinel, and the HPA-scaled ones
(`scaledBy: hpa`), whose history it only records.
*/}}
{{- define "astro-agent.sentinelConfig" -}}
{{- $s := .Values.sentinel -}}
{{- $source := dict "type" $s.source.type -}}
{{- if eq $s.source.type "airflow-api" -}}
{{- $_ := set $source "airflowApi" (dict "url" .Values.airflow.restApi.url) -}}
{{- else if eq $s.source.type "postgres" -}}
{{- $pg := dict "sslMode" $s.source.postgres.sslMode -}}
{{- with $s.source.postgres.caFile }}{{ $_ := set $pg "caFile" . }}{{ end -}}
{{- $_ := set $source "postgres" $pg -}}
{{- else -}}
{{- fail (printf "sentinel.source.type is %q: use airflow-api or postgres" $s.source.type) -}}
{{- end -}}
{{- $auth := dict "disabled" false -}}
{{- if include "astro-agent.boundTokenMode" . -}}
{{- $user := printf "system:serviceaccount:%s:%s" (include "astro-agent.kedaClusterObjectNamespace" .) (include "astro-agent.kedaIdentityName" .) -}}
{{- $review := dict "allowedUsernames" (list $user) "cacheTtl" .Values.keda.auth.boundServiceAccountToken.cacheTtl -}}
{{- with .Values.keda.auth.boundServiceAccountToken.audience }}{{ $_ := set $review "audiences" (list .) }}{{ end -}}
{{- $_ := set $auth "tokenReview" $review -}}
{{- else -}}
{{- $_ := set $auth "staticTokensFile" "/etc/astro-sentinel/tokens/tokens" -}}
{{- end -}}
{{- $workers := list -}}
{{- range $w := (include "astro-agent.workers" . | fromJson).workers -}}
{{- if eq $w.mode "keda" -}}
{{- $preWarm := dict "enabled" $w.preWarm.enabled -}}
{{- with $w.preWarm.lead }}{{ $_ := set $preWarm "lead" (toString .) }}{{ end -}}
{{- with $w.preWarm.maxSlots }}{{ $_ := set $preWarm "maxSlots" (int .) }}{{ end -}}
{{- $worker := dict "name" $w.deploymentName "queues" $w.queueList "syncSlots" (int $w.syncSlots) "minReplicas" (int $w.keda.minReplicaCount) "maxReplicas" (int $w.keda.maxReplicaCount) "preWarm" $preWarm -}}
{{- with $w.keda.overprovisionSlots }}{{ $_ := set $worker "overprovisionSlots" (int .) }}{{ end -}}
{{- $workers = append $workers $worker -}}
{{- else if eq $w.mode "hpa" -}}
{{- $worker := dict "name" $w.deploymentName "queues" $w.queueList "syncSlots" (int $w.syncSlots) "minReplicas" (int $w.hpa.minReplicaCount) "maxReplicas" (int $w.hpa.maxReplicaCount) "scaledBy" "hpa" -}}
{{- if $w.hpaPreWarm -}}
{{- $preWarm := dict "enabled" true -}}
{{- with $w.preWarm.lead }}{{ $_ := set $preWarm "lead" (toString .) }}{{ end -}}
{{- with $w.preWarm.maxSlots }}{{ $_ := set $preWarm "maxSlots" (int .) }}{{ end -}}
{{- $_ := set $worker "preWarm" $preWarm -}}
{{- end -}}
{{- $workers = append $workers $worker -}}
{{- end -}}
{{- end -}}
{{- /* One query reads every queue with postgres: a short interval wakes idle agents sooner. */ -}}
{{- $refresh := toString $s.refreshInterval | default (ternary "500ms" "2s" (eq $s.source.type "postgres")) -}}
{{- $config := dict "refreshInterval" $refresh "stalenessLimit" (toString $s.stalenessLimit) "source" $source "auth" $auth "workers" $workers "schedule" (dict "readInterval" (toString $s.schedule.readInterval)) -}}
{{- $events := dict "maxSubscribers" (int $s.queueEvents.maxSubscribers) -}}
{{- with (include "astro-agent.wakeUsers" . | fromJson).users -}}
{{- $_ := set $events "auth" (dict "tokenReview" (dict "allowedUsernames" . "audiences" (list $s.queueEvents.audience))) -}}
{{- end -}}
{{- $_ := set $config "queueEvents" $events -}}
{{- if $s.kubernetes.enabled -}}
{{- /* The labels every worker Deployment, Pod and ScaledObject of this release carries (each
       worker's selector without its deploymentName): the Sentinel watches only those. */ -}}
{{- $workerLabels := omit (include "astro-agent.workerSelectorMap" (dict "ctx" . "w" dict) | fromJson) "deploymentName" -}}
{{- $kubernetes := dict "namespace" .Release.Namespace "idleFirstScaleIn" $s.kubernetes.idleFirstScaleIn "workerLabels" $workerLabels -}}
{{- if $s.kubernetes.idleFirstScaleIn }}{{ $_ := set $kubernetes "deletionCostLease" (include "astro-agent.deletionCostLeaseName" .) }}{{ end -}}
{{- $_ := set $config "kubernetes" $kubernetes -}}
{{- if $s.kubernetes.userAccess }}{{ $_ := set $auth "kubernetesUsers" dict }}{{ end -}}
{{- end -}}
{{- with include "astro-agent.sentinelHistoryVolume" . -}}
{{- $history := dict "path" (printf "%s/history.bin" (include "astro-agent.sentinelHistoryDir" $)) -}}
{{- if eq . "emptyDir" }}{{ $_ := set $history "volatile" true }}{{ end -}}
{{- $_ := set $config "history" $history -}}
{{- end -}}
{{- toJson $config -}}
{{- end -}}

{{/*
What of the configuration the running Sentinel cannot take without a restart (it applies the
rest of a changed file in place): the source, auth, the history file and whether it reads the
Kubernetes API. Its checksum on the Pod template rolls the Sentinel when one of them changes,
and only then.
*/}}
{{- define "astro-agent.sentinelFixedConfig" -}}
{{- $c := include "astro-agent.sentinelConfig" . | fromJson -}}
{{- $events := $c.queueEvents | default dict -}}
{{- toJson (dict "source" $c.source "auth" $c.auth "history" ($c.history | default dict) "kubernetes" (hasKey $c "kubernetes") "queueEventsAuth" ($events.auth | default dict)) -}}
{{- end -}}
