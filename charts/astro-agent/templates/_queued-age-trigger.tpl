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
{{- include "astro-agent.sentinelTrigger" (dict "root" .root "url" .url "bound" .bound "name" "oldest-queued-age" "metricType" "Value" "valueLocation" "oldestQueuedAgeSeconds" "target" $age.targetSeconds "activation" "") }}
{{- end }}
{{- end -}}
