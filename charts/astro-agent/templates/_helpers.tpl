{{/*
Names, labels and the resolved worker list live here once; every template uses them.
*/}}

{{/* Object name prefix: workers are <prefix>-worker-<name>, the Sentinel is <prefix>-sentinel. */}}
{{- define "astro-agent.prefix" -}}
{{- required "resourceNamePrefix must not be empty" .Values.resourceNamePrefix | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "astro-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "astro-agent.sentinelName" -}}
{{- printf "%s-sentinel" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/* Where the Sentinel keeps its scaling history file (`sentinel.history.enabled`). */}}
{{- define "astro-agent.sentinelHistoryDir" -}}
/var/lib/astro-sentinel
{{- end -}}

{{/* Where airflow.caCertificate is mounted, in the agents and the Sentinel. */}}
{{- define "astro-agent.airflowCaDir" -}}
/etc/astro-agent/airflow-ca
{{- end -}}

{{/* The Secret holding the Airflow settings given as `value`. */}}
{{- define "astro-agent.airflowSecretName" -}}
{{- printf "%s-airflow" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/* The chart-made Secret holding KEDA's static bearer token for the Sentinel. */}}
{{- define "astro-agent.kedaTokenSecretName" -}}
{{- printf "%s-keda-sentinel-token" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{- define "astro-agent.triggerAuthName" -}}
{{- printf "%s-keda-sentinel" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/*
Objects that live outside the release namespace (KEDA's namespace, cluster scope) carry the
release namespace in their name, so two installs with the same prefix do not collide.
*/}}
{{- define "astro-agent.kedaIdentityName" -}}
{{- $a := .Values.keda.auth.boundServiceAccountToken -}}
{{- if $a.serviceAccountName -}}
{{- $a.serviceAccountName -}}
{{- else -}}
{{- printf "%s-%s-keda-sentinel" (include "astro-agent.prefix" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "astro-agent.kedaClusterObjectNamespace" -}}
{{- default .Values.keda.namespace .Values.keda.clusterObjectNamespace -}}
{{- end -}}

{{- define "astro-agent.tokenReviewRoleName" -}}
{{- printf "%s-%s-sentinel-tokenreview" (include "astro-agent.prefix" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "true" when KEDA authenticates with a bound service-account token, "" otherwise. */}}
{{- define "astro-agent.boundTokenMode" -}}
{{- if eq .Values.keda.auth.mode "boundServiceAccountToken" -}}true{{- end -}}
{{- end -}}

{{/* In-cluster base URL of the Sentinel Service, as KEDA's operator reaches it. */}}
{{- define "astro-agent.sentinelUrl" -}}
{{- printf "http://%s.%s.svc.%s:39092" (include "astro-agent.sentinelName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* Labels on every object, as a map (returned as YAML). */}}
{{- define "astro-agent.labelsMap" -}}
{{- $l := dict
  "helm.sh/chart" (include "astro-agent.chart" .)
  "app.kubernetes.io/name" "astro-agent"
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" (toString .Chart.AppVersion)
  "app.kubernetes.io/managed-by" .Release.Service
-}}
{{- toYaml (merge (dict) $l (.Values.commonLabels | default dict)) -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "astro-agent.labels" -}}
{{- include "astro-agent.labelsMap" . -}}
{{- end -}}

{{/* Labels on every object plus extra ones, which win (dict "ctx" $ "extra" (dict ...)). */}}
{{- define "astro-agent.labelsWith" -}}
{{- toYaml (merge (dict) (.extra | default dict) (include "astro-agent.labelsMap" .ctx | fromYaml)) -}}
{{- end -}}

{{/*
metadata.annotations (commonAnnotations merged with .extra), indented for a top-level metadata
block and starting with a newline; prints nothing when there are none.
Call as {{- include "astro-agent.annotations" (dict "ctx" $ "extra" $map) }}
*/}}
{{- define "astro-agent.annotations" -}}
{{- $all := merge (dict) (.extra | default dict) (.ctx.Values.commonAnnotations | default dict) -}}
{{- with $all }}
  annotations:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* Selector labels of one worker (dict "ctx" $ "w" $worker). */}}
{{- define "astro-agent.workerSelectorLabels" -}}
{{- toYaml (include "astro-agent.workerSelectorMap" . | fromJson) -}}
{{- end -}}

{{- define "astro-agent.workerSelectorMap" -}}
{{- toJson (dict "app" "astro-agent" "component" "worker" "app.kubernetes.io/instance" .ctx.Release.Name "deploymentName" .w.deploymentName) -}}
{{- end -}}

{{/*
Pod template labels: like labelsWith, minus the chart and app version, so a chart upgrade that
changes nothing in the Pod does not roll (and drain) every worker.
*/}}
{{- define "astro-agent.podLabels" -}}
{{- toYaml (omit (include "astro-agent.labelsWith" . | fromYaml) "helm.sh/chart" "app.kubernetes.io/version") -}}
{{- end -}}

{{/* Labels of worker objects: common + selector + component. */}}
{{- define "astro-agent.workerLabels" -}}
{{- $extra := include "astro-agent.workerSelectorMap" . | fromJson -}}
{{- $_ := set $extra "app.kubernetes.io/component" "worker" -}}
{{- include (ternary "astro-agent.podLabels" "astro-agent.labelsWith" (not (not .pod))) (dict "ctx" .ctx "extra" (merge $extra (.extra | default dict))) -}}
{{- end -}}

{{- define "astro-agent.sentinelSelectorLabels" -}}
{{- toYaml (include "astro-agent.sentinelSelectorMap" . | fromJson) -}}
{{- end -}}

{{- define "astro-agent.sentinelSelectorMap" -}}
{{- toJson (dict "app" "astro-agent" "component" "sentinel" "app.kubernetes.io/instance" .Release.Name) -}}
{{- end -}}

{{/* Labels of Sentinel objects: common + selector + component. */}}
{{- define "astro-agent.sentinelLabels" -}}
{{- $extra := include "astro-agent.sentinelSelectorMap" . | fromJson -}}
{{- $_ := set $extra "app.kubernetes.io/component" "sentinel" -}}
{{- include "astro-agent.labelsWith" (dict "ctx" . "extra" $extra) -}}
{{- end -}}

{{/* image reference from {repository, tag, digest} (dict "image" $img "ctx" $). */}}
{{- define "astro-agent.image" -}}
{{- $img := .image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (toString (default .ctx.Chart.AppVersion $img.tag)) -}}
{{- end -}}
{{- end -}}

{{/* An httpGet probe on port http (dict "probe" $p "path" "/healthz"); prints nothing when disabled. */}}
{{- define "astro-agent.probe" -}}
{{- $p := .probe -}}
{{- if $p.enabled -}}
httpGet:
  path: {{ .path }}
  port: http
initialDelaySeconds: {{ int $p.initialDelaySeconds }}
periodSeconds: {{ int $p.periodSeconds }}
timeoutSeconds: {{ int $p.timeoutSeconds }}
failureThreshold: {{ int $p.failureThreshold }}
successThreshold: {{ int $p.successThreshold }}
{{- end -}}
{{- end -}}

{{/*
Secret-or-value settings: {value, existingSecret: {name, key}}.
"astro-agent.isSet" prints "true" when either source is given.
*/}}
{{- define "astro-agent.isSet" -}}
{{- if or .value (and .existingSecret .existingSecret.name) -}}true{{- end -}}
{{- end -}}

{{/*
Where a secret-or-value setting lives, as JSON {"name", "key"}, or "" when the setting is empty
(dict "ctx" $ "ref" $setting "key" CHART_KEY "path" VALUE_PATH): the user's Secret when
existingSecret.name is set, else the chart's <prefix>-airflow Secret.
*/}}
{{- define "astro-agent.secretSelector" -}}
{{- $ref := .ref -}}
{{- if and $ref.existingSecret $ref.existingSecret.name -}}
{{- $key := required (printf "%s.existingSecret.key must be set together with %s.existingSecret.name" .path .path) $ref.existingSecret.key -}}
{{- toJson (dict "name" $ref.existingSecret.name "key" $key) -}}
{{- else if $ref.value -}}
{{- toJson (dict "name" (include "astro-agent.airflowSecretName" .ctx) "key" .key) -}}
{{- end -}}
{{- end -}}

{{/*
One env entry reading a secret-or-value setting, as JSON, or "" when the setting is empty
(dict "ctx" $ "env" NAME "ref" $setting "key" CHART_KEY "path" VALUE_PATH). For settings that
are not credentials (URLs, user names): credentials go in files (astro-agent.secretFiles).
*/}}
{{- define "astro-agent.secretEnv" -}}
{{- with include "astro-agent.secretSelector" . -}}
{{- toJson (dict "name" $.env "valueFrom" (dict "secretKeyRef" (fromJson .))) -}}
{{- end -}}
{{- end -}}

{{/*
Credentials as files, never as environment variables: the environment of a process is
readable by every process of its user that it starts, and a container's PID 1 keeps it.
(dict "dir" MOUNT_DIR "items" (list (dict "ctx" $ "env" FILE_FLAG_ENV "ref" $setting "key"
CHART_KEY "path" VALUE_PATH) ...)) returns JSON {"env": [FILE_FLAG_ENV=<dir>/<key>, ...],
"sources": [projected volume sources]}; both lists are empty when no setting is given.
*/}}
{{- define "astro-agent.secretFiles" -}}
{{- $env := list -}}
{{- $sources := list -}}
{{- range $f := .items -}}
{{- with include "astro-agent.secretSelector" $f -}}
{{- $sel := fromJson . -}}
{{- $env = append $env (dict "name" $f.env "value" (printf "%s/%s" $.dir $f.key)) -}}
{{- $sources = append $sources (dict "secret" (dict "name" $sel.name "items" (list (dict "key" $sel.key "path" $f.key)))) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "env" $env "sources" $sources) -}}
{{- end -}}

{{/* A list of env entries from a list of secretEnv arguments, as JSON {"env": [...]}. */}}
{{- define "astro-agent.secretEnvList" -}}
{{- $env := list -}}
{{- range $e := .items -}}
{{- with include "astro-agent.secretEnv" $e -}}
{{- $env = append $env (fromJson .) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "env" $env) -}}
{{- end -}}

{{/*
Every secret-or-value setting the chart knows: env name prefix aside, one table for the Secret
template, the worker and the Sentinel. Returns JSON {"items": [{path, key, ref}]}.
*/}}
{{- define "astro-agent.secretSettings" -}}
{{- $a := .Values.airflow -}}
{{- $items := list
  (dict "path" "airflow.edgeApiUrl" "key" "edge-api-url" "ref" $a.edgeApiUrl)
  (dict "path" "airflow.executionApiUrl" "key" "execution-api-url" "ref" $a.executionApiUrl)
  (dict "path" "airflow.jwtSecret" "key" "jwt-secret" "ref" $a.jwtSecret)
  (dict "path" "airflow.restApi.token" "key" "rest-api-token" "ref" $a.restApi.token)
  (dict "path" "airflow.restApi.username" "key" "rest-api-username" "ref" $a.restApi.username)
  (dict "path" "airflow.restApi.password" "key" "rest-api-password" "ref" $a.restApi.password)
  (dict "path" "sentinel.source.postgres.url" "key" "postgres-url" "ref" .Values.sentinel.source.postgres.url)
-}}
{{- toJson (dict "items" $items) -}}
{{- end -}}

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
hpaTarget (HPA averageValue), fallbackReplicas.
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

{{- /* drain deadline: grace minus margin; half the grace when the margin would eat most of it */ -}}
{{- $grace := int $w.terminationGracePeriodSeconds -}}
{{- if lt $grace 1 -}}
{{- fail (printf "workers[%d].terminationGracePeriodSeconds is %d: it must be at least 1 so the agent can drain its tasks" $i $grace) -}}
{{- end -}}
{{- $margin := int $w.drainMarginSeconds -}}
{{- $drain := div $grace 2 -}}
{{- if ge $grace (mul 2 $margin) -}}{{- $drain = sub $grace $margin -}}{{- end -}}
{{- $_ := set $w "drainTimeoutSeconds" $drain -}}

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
{{- $fb := $w.keda.fallback.replicas -}}
{{- if kindIs "invalid" $fb -}}{{- $fb = max $min 1 -}}{{- end -}}
{{- $_ := set $w "fallbackReplicas" (int $fb) -}}
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
{{- else -}}
{{- $_ := set $w "mode" "fixed" -}}
{{- end -}}
{{- $out = append $out $w -}}
{{- end -}}
{{- toJson (dict "workers" $out) -}}
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

{{/* The gRPC port of the Sentinel's external scaler API. */}}
{{- define "astro-agent.externalScalerPort" -}}39093{{- end -}}

{{/* The Secret with the Sentinel's serving certificate and the CA it trusts for clients. */}}
{{- define "astro-agent.externalScalerServerSecretName" -}}
{{- default (printf "%s-sentinel-external-scaler-tls" (include "astro-agent.prefix" .)) .Values.sentinel.externalScaler.tls.serverSecret -}}
{{- end -}}

{{/* The Secret with KEDA's client certificate and the CA of the Sentinel's certificate. */}}
{{- define "astro-agent.externalScalerClientSecretName" -}}
{{- default (printf "%s-keda-external-scaler-tls" (include "astro-agent.prefix" .)) .Values.sentinel.externalScaler.tls.clientSecret -}}
{{- end -}}

{{- define "astro-agent.externalPushAuthName" -}}
{{- printf "%s-keda-sentinel-external-push" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/*
Checks of the connection settings; renders nothing. Called once from the Secret template.
*/}}
{{- define "astro-agent.validateConnection" -}}
{{- $a := .Values.airflow -}}
{{- $workers := (include "astro-agent.workers" . | fromJson).workers -}}
{{- if $workers -}}
{{- range $path := list "edgeApiUrl" "executionApiUrl" "jwtSecret" -}}
{{- if not (include "astro-agent.isSet" (get $a $path)) -}}
{{- fail (printf "airflow.%s is required when workers are defined: set airflow.%s.value, or airflow.%s.existingSecret.name and .key" $path $path $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $token := include "astro-agent.isSet" $a.restApi.token -}}
{{- $user := include "astro-agent.isSet" $a.restApi.username -}}
{{- $pass := include "astro-agent.isSet" $a.restApi.password -}}
{{- if and $token (or $user $pass) -}}
{{- fail "airflow.restApi: set either token or username + password, not both" -}}
{{- end -}}
{{- if ne (toString $user) (toString $pass) -}}
{{- fail "airflow.restApi.username and airflow.restApi.password go together: set both or neither" -}}
{{- end -}}
{{- if .Values.sentinel.enabled -}}
{{- $type := .Values.sentinel.source.type -}}
{{- if eq $type "airflow-api" -}}
{{- if not $a.restApi.url -}}
{{- fail "sentinel.source.type is airflow-api but airflow.restApi.url is empty: the Sentinel reads backlogs from Airflow's REST API" -}}
{{- end -}}
{{- if not (or $token $user) -}}
{{- fail "sentinel.source.type is airflow-api but airflow.restApi has no credentials: set airflow.restApi.token or username + password" -}}
{{- end -}}
{{- else if eq $type "postgres" -}}
{{- if not (include "astro-agent.isSet" .Values.sentinel.source.postgres.url) -}}
{{- fail "sentinel.source.type is postgres but sentinel.source.postgres.url is empty: set its value or existingSecret" -}}
{{- end -}}
{{- $pg := .Values.sentinel.source.postgres -}}
{{- if and (has $pg.sslMode (list "verify-ca" "verify-full")) (not $pg.caFile) -}}
{{- fail (printf "sentinel.source.postgres.sslMode is %s but sentinel.source.postgres.caFile is empty: give the path of the database's CA (mounted with sentinel.extraVolumes), `system` for the image's trusted roots (verify-full only), or a weaker sslMode" $pg.sslMode) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
