variable "cluster_name" {
  type        = string
  description = "EKS cluster whose tagged node groups cluster-autoscaler manages."
}

variable "region" {
  type        = string
  description = "AWS region of the cluster."
}

variable "autoscaler_role_arn" {
  type        = string
  description = "IRSA role of kube-system/cluster-autoscaler (from the aws root)."
}

variable "cluster_autoscaler_chart_version" {
  type        = string
  description = "Pinned cluster-autoscaler Helm chart version (match its app version to the Kubernetes minor)."
  default     = "9.46.6"
  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.cluster_autoscaler_chart_version))
    error_message = "Pin an exact chart version (x.y.z)."
  }
}

variable "nvidia_device_plugin_chart_version" {
  type        = string
  description = "Pinned NVIDIA k8s-device-plugin Helm chart version."
  default     = "0.17.1"
  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.nvidia_device_plugin_chart_version))
    error_message = "Pin an exact chart version (x.y.z)."
  }
}
