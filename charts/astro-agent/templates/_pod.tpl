{{/*
What the worker and Sentinel containers build the same way: the image reference, the HTTP probes,
and the folders where files are mounted; and the two init containers of a worker Pod, which puts
the agent and the tasks in separate containers (see "The worker Pod" in the README).
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

{{/*
The worker Pod is split in two so that no task can read the agent's credentials:
* the agent container (the chart's image, FROM scratch: the static binary alone) holds the
  Airflow credentials and talks to Airflow;
* the tasks container runs the user's own Airflow image, unmodified, holding no credential; its
  main process is the agent binary in `task-host` mode, which starts the tasks the agent asks for
  over an abstract Unix socket in the Pod's network namespace (no file a task could replace).
The binary reaches the Airflow image through the emptyDir `astro-agent-bin`, filled by the first
init container, so users no longer build an image joining the two.
*/}}

{{/* Where the agent binary is installed for the tasks container. */}}
{{- define "astro-agent.agentBinDir" -}}
/opt/astro-agent/bin
{{- end -}}

{{/*
The task host's socket: an abstract name, in the network namespace the Pod's containers share.
The task host binds it before it starts any task and holds it until the tasks container ends, so
no task can take it over and receive the agent's workloads (a socket file in a shared emptyDir
could be replaced by any task).
*/}}
{{- define "astro-agent.taskHostSocket" -}}
@astro-agent/task-host
{{- end -}}

{{/*
The init container that copies the agent binary into the emptyDir astro-agent-bin. It runs the
agent image (whose binary is /usr/local/bin/astro-agent), and `install` copies the running
binary: the task host is always the very build of the agent that drives it. (dict "w" $w "ctx" $root)
*/}}
{{- define "astro-agent.installAgentContainer" -}}
- name: install-agent
  image: {{ include "astro-agent.image" (dict "image" .w.image "ctx" .ctx) | quote }}
  imagePullPolicy: {{ .w.image.pullPolicy }}
  command: {{ list "/usr/local/bin/astro-agent" "install" (include "astro-agent.agentBinDir" .) | toJson }}
  # One file copied. A Pod requests the larger of its biggest init step and its running
  # containers, so these small figures add nothing to it.
  resources:
    requests:
      cpu: 10m
      memory: 32Mi
    limits:
      memory: 64Mi
  {{- with .w.containerSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: astro-agent-bin
      mountPath: {{ include "astro-agent.agentBinDir" . }}
{{- end -}}

{{/*
The tasks container: a native sidecar (an init container with restartPolicy Always, Kubernetes
>= 1.29). Kubernetes starts it before the agent and, when the Pod is deleted, stops it only after
the agent has exited, so the tasks keep running while the agent drains them. As a second entry of
`containers` it would get SIGTERM together with the agent and kill the tasks being drained.
Nothing of the agent's reaches it: no credential volume, no Airflow secret, none of the agent's
env or envFrom. (dict "w" $w "ctx" $root)
*/}}
{{- define "astro-agent.tasksContainer" -}}
{{- $t := .w.tasks -}}
- name: tasks
  image: {{ include "astro-agent.image" (dict "image" $t.image "ctx" .ctx) | quote }}
  imagePullPolicy: {{ $t.image.pullPolicy }}
  restartPolicy: Always
  {{- /* Its log lines in the worker's logFormat, like the agent's. */}}
  command: {{ list (printf "%s/astro-agent" (include "astro-agent.agentBinDir" .)) "task-host" "--socket" (include "astro-agent.taskHostSocket" .) "--log-format" .w.logFormat | toJson }}
  env:
    - name: TMPDIR
      value: /tmp
    {{- with $t.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $t.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $t.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $t.containerSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: astro-agent-bin
      mountPath: {{ include "astro-agent.agentBinDir" . }}
      readOnly: true
    # Tasks write their logs here and the agent ships them: the same volume at the same path
    # (the agent's --log-folder) in both containers.
    - name: logs
      mountPath: {{ .w.logFolder | quote }}
    # Its own scratch space: nothing a task leaves in /tmp reaches the agent.
    - name: tasks-tmp
      mountPath: /tmp
    {{- with $t.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
