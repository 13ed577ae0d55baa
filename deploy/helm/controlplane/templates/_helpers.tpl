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
{{- if and .Values.store.s3.irsaRoleArn (not .Values.serviceAccount.create) }}
{{- fail "store.s3.irsaRoleArn needs the chart's ServiceAccount (serviceAccount.create: true) to annotate; with your own ServiceAccount, annotate it with eks.amazonaws.com/role-arn yourself and leave irsaRoleArn empty" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail (printf "autoscaling.maxReplicas (%v) is below autoscaling.minReplicas (%v)" .Values.autoscaling.maxReplicas .Values.autoscaling.minReplicas) }}
{{- end }}
{{- end }}
