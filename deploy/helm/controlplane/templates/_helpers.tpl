{{/*
Names, labels, images and the checks on values that every template shares.
*/}}

{{- define "controlplane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "controlplane.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* What selects the fleet's pods: the Deployment, Service, budget, policy and spread. */}}
{{- define "controlplane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "controlplane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: inference-server
{{- end }}

{{- define "controlplane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "controlplane.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: controlplane
{{- end }}

{{- define "controlplane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "controlplane.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository@digest when a digest is given, else repository:tag. */}}
{{- define "controlplane.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (toString (required (printf "%s.tag or %s.digest is required" .path .path) .tag)) }}
{{- end }}
{{- end }}

{{- define "controlplane.image" -}}
{{- include "controlplane.imageRef" (dict "image" .Values.image "tag" (.Values.image.tag | default .Chart.AppVersion) "path" "image") }}
{{- end }}

{{- define "controlplane.tritonImage" -}}
{{- include "controlplane.imageRef" (dict "image" .Values.triton.image "tag" .Values.triton.image.tag "path" "triton.image") }}
{{- end }}

{{- define "controlplane.storeClaimName" -}}
{{- default (printf "%s-store" (include "controlplane.fullname" .)) .Values.store.directory.existingClaim }}
{{- end }}

{{- define "controlplane.storeUri" -}}
{{- if eq .Values.store.type "s3" }}
{{- $prefix := trimAll "/" .Values.store.s3.prefix }}
{{- if $prefix }}
{{- printf "s3://%s/%s" .Values.store.s3.bucket $prefix }}
{{- else }}
{{- printf "s3://%s" .Values.store.s3.bucket }}
{{- end }}
{{- else }}
{{- print "file:///store" }}
{{- end }}
{{- end }}

{{/* The API's port, which the Service, the policy, the webhook and the advertised URL share. */}}
{{- define "controlplane.apiPort" -}}8080{{- end }}

{{/*
Values that cannot work stop the render with what to set. Included once, by the Deployment.
*/}}
{{- define "controlplane.validate" -}}
{{- if not .Values.apiToken.existingSecret }}
{{- fail "apiToken.existingSecret is empty: create a Secret with the API token (kubectl create secret generic controlplane-api --from-literal=token=\"$(openssl rand -hex 32)\") and name it here; the chart never holds the token itself" }}
{{- end }}
{{- if not .Values.apiToken.key }}
{{- fail "apiToken.key is empty: name the key of the token in the Secret apiToken.existingSecret (token)" }}
{{- end }}
{{- with .Values.apiReadToken }}
{{- if and .existingSecret (not .key) }}
{{- fail (printf "apiReadToken.key is empty: name the key of the read token in the Secret %s (read-token)" .existingSecret) }}
{{- end }}
{{- if and .existingSecret (eq .existingSecret $.Values.apiToken.existingSecret) (eq .key $.Values.apiToken.key) }}
{{- fail (printf "apiReadToken and apiToken both name the key %s of the Secret %s: the read token needs a value of its own (the daemon refuses a read token equal to the write token), so put it under another key (read-token)" .key .existingSecret) }}
{{- end }}
{{- end }}
{{- if not (has .Values.store.type (list "directory" "s3")) }}
{{- fail (printf "store.type is %q: use directory (a shared volume) or s3 (a bucket)" .Values.store.type) }}
{{- end }}
{{- if eq .Values.store.type "s3" }}
{{- if not .Values.store.s3.bucket }}
{{- fail "store.type is s3 but store.s3.bucket is empty: name the bucket (and store.s3.prefix inside it)" }}
{{- end }}
{{- if and .Values.store.s3.credentials.existingSecret .Values.store.s3.irsaRoleArn }}
{{- fail "store.s3.credentials.existingSecret and store.s3.irsaRoleArn are both set: keys in the environment win over the role, so set one (the role with IRSA, the Secret with static keys)" }}
{{- end }}
{{- if and .Values.store.s3.sqsQueueUrl .Values.store.s3.snsTopicArn }}
{{- fail "store.s3.sqsQueueUrl and store.s3.snsTopicArn are both set: give the queue the bucket (or topic) already feeds, or the topic on which each pod subscribes a queue of its own, not both" }}
{{- end }}
{{- if and .Values.store.s3.irsaRoleArn (not .Values.serviceAccount.create) }}
{{- fail "store.s3.irsaRoleArn needs the chart's ServiceAccount (serviceAccount.create: true) to annotate; with your own ServiceAccount, annotate it with eks.amazonaws.com/role-arn yourself and leave irsaRoleArn empty" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail (printf "autoscaling.maxReplicas (%v) is below autoscaling.minReplicas (%v)" .Values.autoscaling.maxReplicas .Values.autoscaling.minReplicas) }}
{{- end }}
{{- include "controlplane.validateReadiness" . }}
{{- end }}

{{/*
The sidecar's readiness probe against rollout.unready_seconds. In its turn of a rolling update a
member answers 503 on /readyz and starts to drain and unload unready_seconds later; the kubelet
marks the pod NotReady after failureThreshold failed probes, periodSeconds apart, and only then
do the endpoints drop it. So periodSeconds x failureThreshold must be below the shortest
unready_seconds of any model, as the daemon reads it: model_defaults' (the daemon's default, 5,
when the settings give none), each config.models.<name>'s (model_defaults' when it sets none),
and the literal CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__UNREADY_SECONDS and
CONTROLPLANE_MODELS__<NAME>__ROLLOUT__UNREADY_SECONDS of controlplane.extraEnv, which win over
the settings file as they do in the daemon.
*/}}
{{- define "controlplane.validateReadiness" -}}
{{- $probe := .Values.controlplane.readinessProbe }}
{{- $notReadyAfter := mulf $probe.periodSeconds $probe.failureThreshold }}
{{- /* 5.0: RolloutSettings.unready_seconds, the daemon's default (tests/unit checks both). */}}
{{- $default := dict "seconds" 5.0 "what" "the daemon's default rollout.unready_seconds" "where" "config.model_defaults.rollout.unready_seconds" }}
{{- $rollout := dig "model_defaults" "rollout" (dict) .Values.config }}
{{- if hasKey $rollout "unready_seconds" }}
{{- $default = dict "seconds" (float64 $rollout.unready_seconds) "what" "config.model_defaults.rollout.unready_seconds" "where" "config.model_defaults.rollout.unready_seconds" }}
{{- end }}
{{- $fromEnv := dict }}
{{- range .Values.controlplane.extraEnv }}
{{- $name := upper .name }}
{{- if and (hasKey . "value") (regexMatch "^CONTROLPLANE_MODEL(_DEFAULTS|S__.+)__ROLLOUT__UNREADY_SECONDS$" $name) }}
{{- $where := printf "%s in controlplane.extraEnv" .name }}
{{- $found := dict "seconds" (float64 .value) "what" $where "where" $where }}
{{- if eq $name "CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__UNREADY_SECONDS" }}
{{- $default = $found }}
{{- else }}
{{- $_ := set $fromEnv (regexReplaceAll "^CONTROLPLANE_MODELS__(.+)__ROLLOUT__UNREADY_SECONDS$" $name "${1}" | lower) $found }}
{{- end }}
{{- end }}
{{- end }}
{{- $shortest := $default }}
{{- range $model, $policy := dig "models" (dict) .Values.config }}
{{- $own := $default }}
{{- $rollout := dig "rollout" (dict) ($policy | default dict) }}
{{- if hasKey $rollout "unready_seconds" }}
{{- $where := printf "config.models.%s.rollout.unready_seconds" $model }}
{{- $own = dict "seconds" (float64 $rollout.unready_seconds) "what" $where "where" $where }}
{{- end }}
{{- $own = get $fromEnv $model | default $own }}
{{- if lt $own.seconds $shortest.seconds }}
{{- $shortest = $own }}
{{- end }}
{{- end }}
{{- range $fromEnv }}
{{- if lt .seconds $shortest.seconds }}
{{- $shortest = . }}
{{- end }}
{{- end }}
{{- if ge $notReadyAfter $shortest.seconds }}
{{- fail (printf "controlplane.readinessProbe: periodSeconds x failureThreshold is %v x %v = %v s, not below %s (%v s): a member in its turn of a rolling update would drain and unload while its pod is still ready, and load balancers would keep sending it calls. Lower controlplane.readinessProbe.periodSeconds or controlplane.readinessProbe.failureThreshold, or raise %s, leaving a few seconds for the endpoints to drop the pod" $probe.periodSeconds $probe.failureThreshold $notReadyAfter $shortest.what $shortest.seconds $shortest.where) }}
{{- end }}
{{- end }}
