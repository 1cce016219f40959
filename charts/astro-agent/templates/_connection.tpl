{{/*
The connection settings (Airflow's URLs and credentials, the Sentinel's Postgres URL). Each is a
secret-or-value setting that the Secret template, the agent and the Sentinel read through the
helpers here, so a setting's Secret and key are worked out in one place. The checks of the
settings (which are required, which go together) are at the end.
*/}}

{{/* The Secret holding the Airflow settings given as `value`. */}}
{{- define "astro-agent.airflowSecretName" -}}
{{- printf "%s-airflow" (include "astro-agent.prefix" .) -}}
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
