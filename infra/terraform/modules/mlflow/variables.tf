variable "name" {
  type        = string
  description = "Resource prefix."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the database."
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets for the database."
}

variable "cluster_security_group_id" {
  type        = string
  description = "The EKS cluster security group: the only source allowed to reach PostgreSQL."
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key encrypting the database, its performance insights and the secret."
}

variable "namespace" {
  type        = string
  description = "Kubernetes namespace of the MLflow server."
}

variable "role_arn" {
  type        = string
  description = "IRSA role of the MLflow service account (artifact prefix of the bucket)."
}

variable "bucket" {
  type        = string
  description = "Project bucket; artifacts go under s3://BUCKET/mlflow."
}

variable "image" {
  type        = string
  description = "Container image with mlflow==3.17.2 and psycopg2 (the project image works)."
  validation {
    condition     = can(regex("@sha256:[0-9a-f]{64}$", var.image))
    error_message = "image must be pinned by digest (...@sha256:<64 hex>)."
  }
}

variable "postgres_version" {
  type        = string
  description = "RDS PostgreSQL engine version."
  default     = "16.4"
}

variable "db_instance_class" {
  type        = string
  description = "RDS instance class."
  default     = "db.t4g.small"
}

variable "multi_az" {
  type        = bool
  description = "Run the database in two availability zones."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags applied to every resource."
  default     = {}
}
