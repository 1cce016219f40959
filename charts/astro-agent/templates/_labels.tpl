{{/*
Labels, selectors and annotations of every object. Selectors are apart from the common labels
because a Deployment's selector cannot change after install, while the common labels (chart
version, commonLabels) may.
*/}}

{{- define "astro-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
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
