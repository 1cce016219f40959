{{/*
The optional second KEDA trigger on how long the oldest queued task has waited (the Sentinel's
`oldestQueuedAgeSeconds`), against a latency target. metricType Value: the HPA sizes the pool by
current replicas × age / target, so a wait twice the target asks for twice the workers while it
lasts; below the target this trigger asks for fewer than the backlog trigger, which then decides
(the HPA takes the largest proposal). Same URL and authentication as the backlog trigger.
Arguments: dict "root" (the chart context), "w" (the resolved worker), "url", "bound".
*/}}
{{- define "astro-agent.queuedAgeTrigger" -}}
{{- $age := .w.keda.queuedAge -}}
{{- if $age.enabled -}}
- type: metrics-api
  name: oldest-queued-age
  metricType: Value
  metadata:
    url: {{ .url | quote }}
    format: json
    valueLocation: oldestQueuedAgeSeconds
    targetValue: {{ toString $age.targetSeconds | quote }}
    authModes: bearer
  authenticationRef:
    {{- if .bound }}
    kind: ClusterTriggerAuthentication
    name: {{ include "astro-agent.kedaIdentityName" .root }}
    {{- else }}
    kind: TriggerAuthentication
    name: {{ include "astro-agent.triggerAuthName" .root }}
    {{- end }}
{{- end }}
{{- end -}}
