variable "namespace" {
  type        = string
  description = "Kubernetes namespace of the MLflow server."
}

variable "role_arn" {
  type        = string
  description = "IRSA role of the MLflow service account (the bucket's mlflow/ prefix and the database secret)."
}

variable "db_secret_arn" {
  type        = string
  description = "Secrets Manager secret with the database credential (from the aws root)."
}

variable "region" {
  type        = string
  description = "AWS region of the secret and the bucket."
}

variable "bucket" {
  type        = string
  description = "Project bucket; artifacts go under s3://BUCKET/mlflow."
}

variable "client_part_of" {
  type        = string
  description = "Value of the app.kubernetes.io/part-of label of the pods allowed to reach MLflow (the Ray pods)."
  default     = "sieve-ray"
}

variable "image" {
  type        = string
  description = "Container image with mlflow[auth]==3.17.2, psycopg2 and infra/mlflow/serve.py (the project image)."
  validation {
    condition     = can(regex("@sha256:[0-9a-f]{64}$", var.image))
    error_message = "image must be pinned by digest (...@sha256:<64 hex>)."
  }
}
