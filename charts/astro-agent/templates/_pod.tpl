{{/*
What the worker and Sentinel containers build the same way: the image reference, the HTTP probes,
and the folders where files are mounted.
*/}}

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

{{/* Where airflow.caCertificate is mounted, in the agents and the Sentinel. */}}
{{- define "astro-agent.airflowCaDir" -}}
/etc/astro-agent/airflow-ca
{{- end -}}

{{/* Where the Sentinel keeps its scaling history file (`sentinel.history.enabled`). */}}
{{- define "astro-agent.sentinelHistoryDir" -}}
/var/lib/astro-sentinel
{{- end -}}
