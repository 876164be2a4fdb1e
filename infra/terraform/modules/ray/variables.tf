variable "cluster_name" {
  type        = string
  description = "Name of the RayCluster resource."
  default     = "sieve"
}

variable "namespace" {
  type        = string
  description = "Kubernetes namespace of the Ray cluster."
}

variable "image" {
  type        = string
  description = "The project's training image (infra/Dockerfile), pinned by digest in production."
  validation {
    condition     = can(regex("@sha256:[0-9a-f]{64}$", var.image))
    error_message = "image must be pinned by digest (...@sha256:<64 hex>)."
  }
}

variable "role_arn" {
  type        = string
  description = "IRSA role of the ray service account (bucket prefixes corpora/, runs/, models/)."
}

variable "tracking_uri" {
  type        = string
  description = "MLflow tracking URI inside the cluster."
}

variable "mlflow_secret_name" {
  type        = string
  description = "Kubernetes secret with the jobs' MLflow credential (username, password)."
}

variable "storage_uri" {
  type        = string
  description = "The bucket root as s3://BUCKET (SIEVE_STORAGE in the pods): runs/, models/, corpora/ under it."
  validation {
    condition     = startswith(var.storage_uri, "s3://")
    error_message = "storage_uri must be an s3:// URI: nothing may assume a shared local disk on a cluster."
  }
}

variable "kuberay_chart_version" {
  type        = string
  description = "Pinned kuberay-operator Helm chart version."
  default     = "1.4.2"
  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.kuberay_chart_version))
    error_message = "Pin an exact chart version (x.y.z)."
  }
}

variable "cpu_worker_group" {
  type = object({
    min    = number
    max    = number
    cpus   = number
    memory = string
  })
  description = "Ray CPU worker group (parsing actors, trial drivers) on the EKS cpu node group."
  default     = { min = 0, max = 4, cpus = 14, memory = "56Gi" }
  validation {
    condition     = var.cpu_worker_group.min >= 0 && var.cpu_worker_group.max >= var.cpu_worker_group.min && var.cpu_worker_group.cpus >= 1
    error_message = "cpu_worker_group needs 0 <= min <= max and at least one CPU."
  }
}

variable "gpu_worker_groups" {
  type = list(object({
    name   = string
    min    = number
    max    = number
    gpus   = number
    cpus   = number
    memory = string
  }))
  description = "Ray GPU worker groups; name must match an EKS GPU node group."
  default     = [{ name = "a10g", min = 0, max = 4, gpus = 1, cpus = 7, memory = "28Gi" }]
  validation {
    condition     = alltrue([for g in var.gpu_worker_groups : g.min >= 0 && g.max >= g.min && g.gpus >= 1])
    error_message = "Each worker group needs 0 <= min <= max and at least one GPU."
  }
}
