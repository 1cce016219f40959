{{/*
The names every object's name is built from. A name that belongs to one concern lives with it: the
worker Deployments in _workers.tpl, KEDA's authentication objects in _auth.tpl, the connection
Secret in _connection.tpl.
*/}}

{{/* Object name prefix: workers are <prefix>-worker-<name>, the Sentinel is <prefix>-sentinel. */}}
{{- define "astro-agent.prefix" -}}
{{- required "resourceNamePrefix must not be empty" .Values.resourceNamePrefix | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "astro-agent.sentinelName" -}}
{{- printf "%s-sentinel" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/* The Lease whose holder alone among the Sentinel's replicas sets pod deletion costs. */}}
{{- define "astro-agent.deletionCostLeaseName" -}}
{{- printf "%s-deletion-cost" (include "astro-agent.sentinelName" .) -}}
{{- end -}}
